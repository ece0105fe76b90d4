"""The process heap under load: glibc malloc arenas (docs/architecture.md, Stores).

Under load the gateway's threads (the default executor that runs big requests and store calls
off the loop, and LanceDB's and tokio's worker threads) each get their own glibc malloc arena,
up to 8 per core. Memory freed in one arena is reused only by the threads of that arena, so the
free part of the heap grows with time even though live data does not: in `bench/load.py`
(200 clients, 20 sessions) the allocator held 400-900 MB free of a ~1.5 GB RSS, growing, while
Python's own allocations (tracemalloc) stayed at ~160 MB. Capping the arenas, as the
``MALLOC_ARENA_MAX`` environment variable does, keeps freed memory reusable by every thread.

`limit_arenas` must run before the process starts its threads (``palimpsest serve`` calls it
first); it is a no-op where the C library is not glibc (musl, macOS), and when
``MALLOC_ARENA_MAX`` is already set in the environment (the operator's choice wins).
`trim` returns the free top and whole free pages of every arena to the kernel
(``malloc_trim(0)``); `trim_every` does that periodically, off the event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("palimpsest.memory")

M_ARENA_MAX = -8  # mallopt parameter (glibc malloc.h)


def glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        libc.mallopt, libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas at `arenas` (0: leave the default). True when applied."""
    if arenas <= 0 or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, ctypes.c_int(arenas)))


def trim() -> bool:
    """Give free heap pages back to the kernel; True when some were released (glibc only)."""
    libc = glibc()
    return bool(libc is not None and libc.malloc_trim(ctypes.c_size_t(0)))


def trim_while_serving(app, interval_s: float) -> None:
    """Run `trim_every(interval_s)` for the life of the aiohttp `app` (0: never)."""
    if interval_s <= 0:
        return

    async def trimming(app):
        task = asyncio.create_task(trim_every(interval_s))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app.cleanup_ctx.append(trimming)


async def trim_every(interval_s: float) -> None:
    """Run `trim` every `interval_s` seconds in a worker thread, until cancelled."""
    if interval_s <= 0 or glibc() is None:
        return
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(trim)
        except Exception:  # pragma: no cover - a failed trim only leaves the heap as it was
            log.warning("malloc_trim failed", exc_info=True)
