#!/bin/sh
# Makes what compose.yaml mounts, in deploy/secrets/: a CA (ca.crt, ca.key),
# a server certificate it signs for the host name the daemons connect to
# (default "postgres", the compose service; give another as $1), and a random
# password for the "queue" role. Run once; it refuses to overwrite.
set -eu
cd "$(dirname "$0")"
NAME=${1:-postgres}
[ ! -e secrets ] || { echo "deploy/secrets exists; remove it first" >&2; exit 1; }
mkdir -m 700 secrets && cd secrets
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
# shellcheck disable=SC2086
openssl req -x509 $EC -keyout ca.key -out ca.crt -days 825 -subj "/CN=queue-daemon CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
# shellcheck disable=SC2086
openssl req $EC -keyout server.key -out server.csr -subj "/CN=$NAME"
printf 'subjectAltName=DNS:%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$NAME" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
    -extfile server.ext -out server.crt
rm server.csr server.ext
# hex: a password that needs no escaping inside a DSN
openssl rand -hex 24 > pg-password
chmod 600 ca.key server.key pg-password
chmod 644 ca.crt server.crt
echo "made $(pwd): keep ca.key offline; server.key must be owned by the server's user" \
    "(999 in the postgres image: chown 999:999 server.key server.crt)"
