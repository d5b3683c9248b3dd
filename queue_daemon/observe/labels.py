"""Bounded metric label values: the first tenants and (tenant, type) pairs get
a label of their own, later ones share ``OTHER``."""

from __future__ import annotations

from queue_daemon.domain.names import JobType

OTHER = "_other"  # the label value of tenants and types beyond the caps
METRICS_TENANTS = 100  # tenants with a label of their own (--metrics-tenants)
METRICS_TYPES = 200  # (tenant, type) pairs with a type label of their own (--metrics-types)


class LabelCap:
    """Label values for tenants and (tenant, type) pairs, at most ``tenants`` and
    ``types`` of them of their own; the rest are ``OTHER``.

    Only admitted values are remembered, so memory stays bounded however many
    names come by.
    """

    def __init__(self, tenants: int, types: int) -> None:
        self._tenant_cap = tenants
        self._type_cap = types
        self._tenants: set[str] = set()
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}

    def tenant(self, client: str) -> str:
        if client in self._tenants:
            return client
        if len(self._tenants) < self._tenant_cap:
            self._tenants.add(client)
            return client
        return OTHER

    def pair(self, client: str, jobtype: str) -> tuple[str, str]:
        """(tenant label, type label) of a tenant's jobtype."""
        key = (client, jobtype)
        known = self._pairs.get(key)
        if known is not None:
            return known
        tenant = self.tenant(client)
        if tenant == OTHER or len(self._pairs) >= self._type_cap:
            return tenant, OTHER
        self._pairs[key] = key
        return key

    def stored(self, stored_type: str) -> tuple[str, str]:
        """Labels of a stored jobtype ``client-type`` (client names hold no ``-``)."""
        jobtype = JobType.parse(stored_type)
        return self.pair(jobtype.client, jobtype.name)
