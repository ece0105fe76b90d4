"""Storage quotas: how much of the ledger one tenant may fill.

``[tenants.NAME] max_stored_mb`` (else ``store.max_stored_mb``; 0 = no limit) bounds the bytes
of a tenant's stored messages. A tenant at or over its quota gets 429 ``storage_quota_exceeded``
before anything of its request is stored or sent upstream; the request that crosses the line
is still stored whole (it is at most ``server.max_body_mb``), so nothing already accepted is
ever lost. Usage is read from the ledger when a tenant is first seen (in a worker thread), kept
up to date with what this process stores, and read again every ``REFRESH_S`` (deletions,
expiry, other replicas). A tenant never read is told by its absence, not by a read time of 0:
``time.monotonic()`` counts from the host's boot, so on a fresh host a zero looked recent and
the quota went unchecked. Concurrent checks of one tenant share one read, and what is stored
while it runs is added to its result: a write may then count twice until the next refresh
(a 429 a little early), never not at all.
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
        self._reading: dict[str, asyncio.Future[int]] = {}  # tenant -> its read in flight
        self._during: dict[str, int] = {}  # tenant -> bytes stored while its read is in flight

    def limit(self, tenant: str) -> int:
        return self._limits.get(tenant, self._default)

    async def check(self, tenant: str) -> None:
        """StorageQuotaExceeded (429) when the tenant's stored messages fill its quota."""
        limit = self.limit(tenant)
        if not limit:
            return
        entry = self._usage.get(tenant)
        if entry is None or time.monotonic() - entry[1] > REFRESH_S:
            used = await self._read(tenant)
        else:
            used = entry[0]
        if used >= limit:
            raise StorageQuotaExceeded(
                f"This tenant's stored conversations use {used / 2**20:.1f} MiB of its {limit / 2**20:g} MiB "
                "storage quota: delete sessions or ask the operator for more (max_stored_mb)."
            )

    async def _read(self, tenant: str) -> int:
        """The tenant's usage read from the ledger, plus what was stored meanwhile; one read
        at a time per tenant, awaited by every check that needs it."""
        reading = self._reading.get(tenant)
        if reading is None:
            reading = asyncio.ensure_future(self._read_once(tenant))
            self._reading[tenant] = reading
        return await asyncio.shield(reading)  # one caller cancelled (client gone) leaves the read to the others

    async def _read_once(self, tenant: str) -> int:
        self._during[tenant] = 0
        try:
            used = await asyncio.to_thread(self._ledger.tenant_bytes, tenant)
            used += self._during[tenant]
            if tenant not in self._usage and len(self._usage) >= TENANTS_TRACKED:
                self._usage.clear()
            self._usage[tenant] = (used, time.monotonic())
            return used
        finally:
            del self._during[tenant], self._reading[tenant]

    def stored(self, tenant: str, n_bytes: int) -> None:
        if tenant in self._during:
            self._during[tenant] += n_bytes
        if tenant in self._usage:
            used, read_at = self._usage[tenant]
            self._usage[tenant] = (used + n_bytes, read_at)
