"""What holds the recall index's memory under load, without the gateway.

    python -m bench.lance_memory --seconds 150            # 20 sessions, the index as the gateway uses it
    python -m bench.lance_memory --cache-mb 128           # one variant at a time (see --help)

Reproduces the write/search pattern of `bench/load.py` on `store.index.SearchIndex` directly: N
sessions, each receiving small batches of agent-session text (simulator/workloads.py: a user
turn, a tool output, an answer) through `add` (which checks known ids, embeds, appends, and
schedules `optimize()` like the indexer's catch-ups), with searches in between. Every
`--sample-s` it prints the process's RSS, glibc's heap (mallinfo2: in use, free, mmapped), rows
stored, adds, searches, open data files and threads; at the end the growth after warm-up the
way bench/load.py computes it (median of the first samples after the first third vs the last).

Like `palimpsest serve`, the process caps glibc's arenas (2) and trims the heap every 60 s unless
told otherwise, so the figures compare with the gateway's. The defaults match what the gateway's
index received in bench/load.py (adds of ~75 rows: 20-25 LanceDB versions per session in 120 s;
proactive searches scoped to one of ten conversations). After the load it idles, trims and samples
again, then closes the index: what stays is retained (caches, handles, a leak), the rest was in
flight. Findings, 150 s runs: before the fixes RSS grew +38.7% after warm-up and
glibc's in-use heap 119 -> 225 MB, tracking LanceDB's cache as it filled to its 128 MB cap; with
a 16 MB cap still +27% (in-use 92 -> 161 MB in flight: scoped searches re-queried deeper and
deeper, reading the whole session each round). With scoped searches prefiltered, embeddings in
batches of 16 and a 32 MB cache: +4.8% (120 s), and closing the index gave back only the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import random
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo() -> dict[str, float]:
    """glibc's heap in MB: in use (uordblks), free in arenas (fordblks), mmapped chunks (hblkhd)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"used": info.uordblks / 2**20, "free": info.fordblks / 2**20, "mmap": info.hblkhd / 2**20}


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def open_files(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(path)):
                count += 1
        except OSError:
            pass
    return count


def texts(seed: int, rounds: int = 16):
    """Endless (role, text) of agent conversations, as a session's ledger receives them."""
    from simulator.workloads import synthetic_session

    conversation = 0
    while True:
        workload = synthetic_session(seed=seed * 1000 + conversation, rounds=rounds, min_tokens=150, max_tokens=1100)
        for number, spec in enumerate(workload.rounds):
            yield "user", spec["user"]
            yield "tool", spec["output"]
            yield "assistant", f"Done with step {number + 1} of conversation {conversation}; the output looked as expected."
        conversation += 1


class Run:
    def __init__(self, args, path: Path) -> None:
        self.args = args
        self.path = path
        self.index = None
        self.adds = self.searches = self.rows = self.events = 0
        self.samples: list[tuple[float, float, dict, int]] = []

    def open_index(self):
        from store.embedders import HashingEmbedder, WordLlamaEmbedder
        from store.index import SearchIndex

        embedder = WordLlamaEmbedder() if self.args.embedder == "wordllama" else HashingEmbedder()
        if self.index is not None:
            embedder = self.index._embedder  # the model stays loaded; only LanceDB's handles go
        return SearchIndex(str(self.path / "index"), embedder, cache_bytes=self.args.cache_mb * 2**20)

    async def session(self, number: int, stop_at: float) -> None:
        """One session: a writer adding batches and `--searchers` searching meanwhile, as the
        gateway's catch-ups and (late) proactive searches of one session overlap."""
        state = {"queries": [], "paths": [[] for _ in range(self.args.agents)]}
        await asyncio.gather(self.writer(number, stop_at, state),
                             *(self.searcher(number, n, stop_at, state) for n in range(self.args.searchers)))

    async def writer(self, number: int, stop_at: float, state: dict) -> None:
        from store.index import IndexedEvent

        rng = random.Random(number)
        key = f"load-{number}"
        source = texts(number)
        seq = 0
        # Each of `agents` agents has its own conversation in the session (--scope limits a
        # search to the hidden part of one of them, as proactive recall's path_scope does).
        paths = state["paths"]
        while time.monotonic() < stop_at:
            batch = []
            for _ in range(rng.randint(1, 2 * self.args.events_per_add - 1)):
                role, text = next(source)
                batch.append(IndexedEvent(f"{key}-{seq}", seq, role, time.time(), text))
                path = paths[rng.randrange(self.args.agents)]
                if len(path) >= 3 * 16:
                    path.clear()  # the agent starts a new conversation
                path.append(f"{key}-{seq}")
                seq += 1
                if role == "user":
                    state["queries"] = [*state["queries"][-19:], text.split(" [[call")[0]]
            if not self.args.no_add:
                added = await self.index.add(key, batch)  # not `+= await`: other sessions add meanwhile
                self.rows += added
                self.adds += 1
                state["created"] = True
            else:
                await self.index._embedder.embed([event.text for event in batch])
            self.events += len(batch)
            if self.args.reopen_every and self.adds and self.adds % self.args.reopen_every == 0:
                await self.reopen()
            await asyncio.sleep(rng.uniform(0.5, 1.5) * self.args.interval_s)

    async def searcher(self, number: int, searcher: int, stop_at: float, state: dict) -> None:
        rng = random.Random(number * 100 + searcher + 1)
        key = f"load-{number}"
        while time.monotonic() < stop_at and not self.args.no_search:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * self.args.search_interval_s)
            if not state.get("created"):
                continue  # as in the gateway, a search comes after the session's first catch-up
            within = frozenset(rng.choice(state["paths"])[:-6]) if self.args.scope else None
            if not state["queries"] or within == frozenset():
                continue
            await self.index.search(key, rng.choice(state["queries"])[:400], limit=5, within=within)
            self.searches += 1

    async def reopen(self) -> None:
        old = self.index
        self.index = self.open_index()
        for task in list(old._maintenance.values()):
            await asyncio.gather(task, return_exceptions=True)
        old.close()

    async def observe(self, started: float, stop_at: float) -> None:
        from gateway.ops.memory import trim

        last_trim = time.monotonic()
        while time.monotonic() < stop_at:
            if self.args.trim_s and time.monotonic() - last_trim >= self.args.trim_s:
                await asyncio.to_thread(trim)
                last_trim = time.monotonic()
            t = time.monotonic() - started
            heap = mallinfo()
            self.samples.append((t, rss_mb(), heap, self.rows))
            cache = self.index._lance_session.size_bytes / 2**20 if self.index is not None else 0
            print(f"{t:6.0f} s  rss {rss_mb():6.0f} MB  heap used {heap.get('used', 0):6.0f} free {heap.get('free', 0):5.0f} "
                  f"mmap {heap.get('mmap', 0):5.0f}  rows {self.rows:6d} events {self.events:6d} adds {self.adds:5d} "
                  f"searches {self.searches:5d}  files {open_files(self.path):4d} threads {threads():3d} cache {cache:4.0f} MB",
                  flush=True)
            await asyncio.sleep(self.args.sample_s)


def configure(args) -> None:
    """Apply the variant under test to store.index (one thing at a time)."""
    import store.index as index

    if args.maintain_after_adds is not None:
        index.MAINTAIN_AFTER_ADDS = args.maintain_after_adds
    if args.maintain_after_rows is not None:
        index.MAINTAIN_AFTER_ROWS = args.maintain_after_rows
    if args.cleanup_s is not None:
        index._KEEP_OLD_VERSIONS = timedelta(seconds=args.cleanup_s)
    if args.no_optimize:
        index.MAINTAIN_AFTER_ADDS = index.MAINTAIN_AFTER_ROWS = 10**9
    if args.embed_batch is not None:
        from store import embedders

        original = embedders.WordLlamaEmbedder._embed_blocking

        def bounded(self, texts):
            import numpy as np

            parts = [original(self, texts[i:i + args.embed_batch]) for i in range(0, len(texts), args.embed_batch)]
            return np.concatenate(parts) if parts else original(self, texts)

        embedders.WordLlamaEmbedder._embed_blocking = bounded


async def main_async(args) -> dict:
    from gateway.ops.memory import limit_arenas, trim

    limit_arenas(args.arenas)  # before LanceDB starts its threads, as `serve` does
    configure(args)
    path = Path(tempfile.mkdtemp(prefix="palimpsest-lance-memory-"))
    run = Run(args, path)
    try:
        run.index = await asyncio.to_thread(run.open_index)
        await run.index._embedder.embed(["warm up"])
        started = time.monotonic()
        stop_at = started + args.seconds
        await asyncio.gather(run.observe(started, stop_at), *(run.session(n, stop_at) for n in range(args.sessions)))
        for task in list(run.index._maintenance.values()):
            await asyncio.gather(task, return_exceptions=True)
        # What stays once the load stops: retained (a leak, caches, handles) vs in flight.
        await asyncio.sleep(args.idle_s)
        trim()
        idle = mallinfo()
        print(f"idle {args.idle_s:.0f} s after the load, trimmed: rss {rss_mb():.0f} MB heap used {idle.get('used', 0):.0f} "
              f"free {idle.get('free', 0):.0f}; LanceDB cache {run.index._lance_session.size_bytes / 2**20:.0f} MB", flush=True)
        run.index.close()
        run.index = None
        import gc

        gc.collect()
        trim()
        closed = mallinfo()
        print(f"index closed, trimmed: rss {rss_mb():.0f} MB heap used {closed.get('used', 0):.0f} free {closed.get('free', 0):.0f}",
              flush=True)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    warm = args.seconds * args.warmup
    after = [(rss, heap.get("used", 0.0)) for t, rss, heap, _ in run.samples if t >= warm]
    k = max(1, min(5, len(after) // 4))
    first = statistics.median(r for r, _ in after[:k])
    last = statistics.median(r for r, _ in after[-k:])
    heap_first = statistics.median(h for _, h in after[:k])
    heap_last = statistics.median(h for _, h in after[-k:])
    summary = {"rss_warm": first, "rss_end": last, "growth": (last - first) / first,
               "heap_warm": heap_first, "heap_end": heap_last, "rows": run.rows, "adds": run.adds, "searches": run.searches}
    print(f"RSS after warm-up ({warm:.0f} s) {first:.0f} -> {last:.0f} MB ({summary['growth']:+.1%}); heap in use "
          f"{heap_first:.0f} -> {heap_last:.0f} MB; {run.rows} rows in {run.adds} adds, {run.searches} searches", flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1 / 3)
    parser.add_argument("--interval-s", type=float, default=2.0, help="mean pause between a session's adds")
    parser.add_argument("--events-per-add", type=int, default=25, help="mean events per add (1 .. 2n-1)")
    parser.add_argument("--searchers", type=int, default=1, help="concurrent searchers per session")
    parser.add_argument("--search-interval-s", type=float, default=1.0, help="mean pause between a searcher's searches")
    parser.add_argument("--whole-session", dest="scope", action="store_false",
                        help="searches over the whole session (default: one agent's hidden events, as proactive recall's)")
    parser.add_argument("--agents", type=int, default=10, help="agents (conversations) per session, for --scope")
    parser.add_argument("--embedder", choices=("wordllama", "hashing"), default="wordllama")
    parser.add_argument("--cache-mb", type=int, default=32, help="LanceDB Session cache bound (recall.index_cache_mb)")
    parser.add_argument("--reopen-every", type=int, default=0, help="close and reopen the whole index every N adds (0: never)")
    parser.add_argument("--maintain-after-adds", type=int)
    parser.add_argument("--maintain-after-rows", type=int)
    parser.add_argument("--cleanup-s", type=float, help="optimize(cleanup_older_than=...) in seconds")
    parser.add_argument("--no-optimize", action="store_true")
    parser.add_argument("--no-search", action="store_true")
    parser.add_argument("--no-add", action="store_true", help="embed the rows but write nothing (searches find nothing)")
    parser.add_argument("--embed-batch", type=int, help="embed at most this many texts per WordLlama call")
    parser.add_argument("--idle-s", type=float, default=10.0, help="pause after the load before the last sample")
    parser.add_argument("--arenas", type=int, default=2, help="glibc malloc arenas (0: glibc's default)")
    parser.add_argument("--trim-s", type=float, default=60.0, help="malloc_trim every N s (0: never)")
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
