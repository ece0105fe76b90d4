"""Storage quotas: how much of the ledger one tenant may fill.

``[tenants.NAME] max_stored_mb`` (else ``store.max_stored_mb``; 0 = no limit) bounds the bytes
of a tenant's stored messages. A tenant at or over its quota gets 429 ``storage_quota_exceeded``
before anything of its request is stored or sent upstream; the request that crosses the line
is still stored whole (it is at most ``server.max_body_mb``), so nothing already accepted is
ever lost. Usage is read from the ledger when a tenant is first seen (in a worker thread), kept
up to date with what this process stores, and read again every ``REFRESH_S`` (deletions,
expiry, other replicas).
"""

from __future__ import annotations

import asyncio
import time

from gateway.http.errors import StorageQuotaExceeded

REFRESH_S = 600.0
TENANTS_TRACKED = 10_000


class StorageQuota:
    def __init__(self, ledger, default_mb: float, per_tenant: dict[str, float | None]) -> None:
        self._ledger = ledger
        self._default = int(default_mb * 2**20)
        self._limits = {name: int(mb * 2**20) for name, mb in per_tenant.items() if mb is not None}
        self._usage: dict[str, tuple[int, float]] = {}  # tenant -> (bytes stored, when read)

    def limit(self, tenant: str) -> int:
        return self._limits.get(tenant, self._default)

    async def check(self, tenant: str) -> None:
        """StorageQuotaExceeded (429) when the tenant's stored messages fill its quota."""
        limit = self.limit(tenant)
        if not limit:
            return
        used, read_at = self._usage.get(tenant, (0, 0.0))
        if time.monotonic() - read_at > REFRESH_S:
            used = await asyncio.to_thread(self._ledger.tenant_bytes, tenant)
            if len(self._usage) >= TENANTS_TRACKED:
                self._usage.clear()
            self._usage[tenant] = (used, time.monotonic())
        if used >= limit:
            raise StorageQuotaExceeded(
                f"This tenant's stored conversations use {used / 2**20:.1f} MiB of its {limit / 2**20:g} MiB "
                "storage quota: delete sessions or ask the operator for more (max_stored_mb)."
            )

    def stored(self, tenant: str, n_bytes: int) -> None:
        if tenant in self._usage:
            used, read_at = self._usage[tenant]
            self._usage[tenant] = (used + n_bytes, read_at)
