"""Reading a daemon's ``/metrics`` with prometheus-client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from harness.api import Api

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of the exposition: (name, labels) -> value."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a series not (yet) exposed."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for n, labels in samples if n == name and label in dict(labels)}


async def scrape(api: Api) -> Samples:
    reply = await api.metrics()
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"].startswith("text/plain"), reply.headers
    return parse(reply.body.decode())
