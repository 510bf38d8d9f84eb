"""What one auction server does differently when it is one replica of several.

Every replica has a name (`INFERENCE_AUCTION_REPLICA_NAME`, by default `host:port`). Answers
that live in this process carry it (health, timings, a header on every response, and the
metrics once the name is set explicitly), so that a deployment's numbers can be told apart;
answers that live in the database (balances, reconcile) are the same from every replica and
say so.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from inference_auctions.server.settings import ServerSettings

REPLICA_HEADER = "x-inference-auction-replica"


def replica_name(settings: ServerSettings) -> str:
    """This replica's name: the configured one, else the address it listens on."""
    return settings.replica_name or f"{settings.host}:{settings.port}"


def replica_header(settings: ServerSettings) -> tuple[bytes, bytes]:
    """The header naming this replica on every response, raw as ASGI sends it (the request-id
    middleware adds it, in the same pass as its own)."""
    return REPLICA_HEADER.encode(), replica_name(settings).encode("latin-1", errors="replace")


def rate_limit_share(settings: ServerSettings) -> tuple[float, int]:
    """This replica's part of the per-key limit: rate and burst divided by the replica count.

    The deployment-wide limit is then the configured one: N replicas together admit at most
    `rate` a second and `burst` at once for one key, however the router spreads it.
    """
    replicas = settings.rate_limit_replicas
    return settings.rate_limit_per_second / replicas, max(1, settings.rate_limit_burst // replicas)


class ReplicaLabelled(Collector):
    """A registry's metrics with one more label, `replica`, on every sample."""

    def __init__(self, registry: CollectorRegistry, replica: str) -> None:
        self._registry = registry
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        """Each metric of the registry, its samples labelled with the replica."""
        for metric in self._registry.collect():
            labelled = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, "replica": self._replica})
                for sample in metric.samples
            ]
            yield labelled
