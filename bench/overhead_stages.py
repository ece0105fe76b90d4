"""Wall-clock time of the gateway's request stages (issue 25), in-process, on ``bench/overhead.py``'s
workloads: where the gateway's own time goes, stage by stage, without a profiler's distortion.

    PYTHONPATH=$PWD python bench/overhead_stages.py --api responses --body-kb 500 --n 200
    PYTHONPATH=<tree> python bench/overhead_stages.py --api chat --n 300    # another tree's stages

``bench/overhead_calls.py``'s setup (the gateway in this process, the puppet in its own, overhead.py's
client and bodies), with its profiler replaced by timers: the stage functions below are wrapped
(p50 and mean of each call, µs) and so is every SQL statement on the ledger's and the response
ids' connections. ``outside the upstream wait`` is a turn's time from its start (before the body is
read) to its observation, less the wait for the upstream's answer head; ``until the response
ended`` the same up to the end of the response's last write (what the client waits for). Stages that a tree does
not have are skipped. Times move with the machine's load: compare trees in alternating runs.

``--extra module:Owner.name,module:function`` times more functions (an owner-less name is a
module-level function; it is replaced in its module, so callers that imported it by name are
not timed).

SQL rows also show their thread CPU time (p50). ``--warm-probe`` follows each ledger COMMIT with
a second, one-page transaction (``probe`` rows: BEGIN IMMEDIATE, an UPDATE of the newest
session's row to itself, COMMIT), the same statements on a warm path, to set against the first.
"""

from __future__ import annotations

import collections
import functools
import importlib
import inspect
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead_calls as oc  # noqa: E402  (sets sys.path for the tree measured)
from sql_probe import WrappedConnection, probe_after_commit  # noqa: E402

STAGES = [
    ("gateway.http.edge", "GatewayRequest.read"), ("gateway.pipeline.pipeline", "Pipeline.parsed"),
    ("gateway.pipeline.history_ids", "RecentBodies.resends"), ("gateway.pipeline.history_ids", "ListMemo.parse"),
    ("gateway.pipeline.history_ids", "HistoryIds.ids"), ("gateway.pipeline.pipeline", "Pipeline.start"),
    ("gateway.responses.routes", "ResponsesRoutes.own_state"), ("gateway.pipeline.views", "ViewBuilder.begin"),
    ("store.checkpoints", "DiskCheckpoints.list"), ("gateway.pipeline.pipeline", "Pipeline.view"),
    ("store.ledger", "Ledger.sync"), ("gateway.pipeline.pipeline", "Pipeline.sync"), ("gateway.pipeline.pipeline", "Pipeline.turn"),
    ("gateway.pipeline.pipeline", "Pipeline._learn_payload"), ("store.ledger", "Ledger.append"),
    ("gateway.jobs.summarizer", "Summarizer.after_turn"), ("gateway.pipeline.turn", "TurnRecorder.answer"),
    ("store.response_ids", "ResponseIds.remember"), ("gateway.pipeline.pipeline", "Pipeline.record"),
    ("gateway.pipeline.pipeline", "Pipeline.answer"), ("gateway.pipeline.pipeline", "Pipeline.relay"),
    ("gateway.pipeline.turn", "TurnRecorder.observe"),
]
times: dict[str, list[float]] = collections.defaultdict(list)
cpu: dict[str, list[float]] = collections.defaultdict(list)  # SQL statements' thread CPU time
measuring = [False]
warm_probe = [False]
_first: list = []


class Timers:
    """Stands in for overhead_calls' profiler: its first instance (the measured requests) switches
    the timers on and off; the worker-thread ones do nothing."""

    def __init__(self) -> None:
        if not _first:
            _first.append(self)

    def enable(self) -> None:
        measuring[0] = measuring[0] or self is _first[0]

    def disable(self) -> None:
        if self is _first[0]:
            measuring[0] = False


class NoStats:
    def __init__(self, *_) -> None:
        self.stats: dict = {}
        self.total_calls = 0

    def add(self, *_) -> None:
        pass


class TimedConnection(WrappedConnection):
    """A sqlite3 connection whose statements are timed (by their text, values left out)."""

    def __init__(self, db: sqlite3.Connection, name: str) -> None:
        super().__init__(db)
        self._name = name

    def _timed(self, method, sql: str, *args):
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return method(sql, *args)
        finally:
            if measuring[0]:
                label = f"sql {self._name}: {' '.join(sql.split())[:56]}"
                times[label].append(time.perf_counter() - started)
                cpu[label].append(time.thread_time() - cpu_started)
                if warm_probe[0] and sql == "COMMIT" and self._name == "ledger.sqlite3":
                    probe_after_commit(self._db, times)


def timed(fn, label: str):
    def note(started: float) -> None:
        if measuring[0]:
            times[label].append(time.perf_counter() - started)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                note(started)
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                note(started)
    return wrapper


def install(extra: list[tuple[str, str]]) -> None:
    for module, path in [*STAGES, *extra]:
        owner_name, _, name = path.rpartition(".")
        owner = importlib.import_module(module)
        owner = getattr(owner, owner_name, None) if owner_name else owner
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, timed(getattr(owner, name), path))
    connect = sqlite3.connect

    def timed_connect(*args, **kwargs):
        db, name = connect(*args, **kwargs), str(args[0]).rsplit("/", 1)[-1]
        return TimedConnection(db, name) if name in ("ledger.sqlite3", "responses.sqlite3") else db

    shim = type("sqlite3", (), {"connect": staticmethod(timed_connect), "OperationalError": sqlite3.OperationalError})
    for module in ("store.ledger", "store.response_ids"):
        importlib.import_module(module).sqlite3 = shim  # type: ignore[attr-defined]
    turn = importlib.import_module("gateway.pipeline.turn")
    observe = turn.TurnRecorder.observe
    from aiohttp import web
    write_eof, ended = web.StreamResponse.write_eof, [0.0]

    async def eof(self, *args, **kwargs):  # the gateway's responses (the puppet runs in its own process)
        ending = not self._eof_sent
        try:
            return await write_eof(self, *args, **kwargs)
        finally:
            if ending:
                ended[0] = time.perf_counter()

    def observed(self, t):
        if measuring[0]:
            times["outside the upstream wait"].append(time.perf_counter() - t.timing.started - t.timing.upstream)
            times["the same, until the response ended"].append(ended[0] - t.timing.started - t.timing.upstream)
        return observe(self, t)

    web.StreamResponse.write_eof = eof

    turn.TurnRecorder.observe = observed
    oc.cProfile.Profile = Timers  # type: ignore[misc]
    oc.pstats.Stats = NoStats  # type: ignore[misc]


def main() -> None:
    args, extra = sys.argv[1:], []
    if "--extra" in args:
        at = args.index("--extra")
        extra = [tuple(item.split(":", 1)) for item in args[at + 1].split(",") if item]
        del args[at:at + 2]
    install(extra)
    warm_probe[0] = "--warm-probe" in args
    sys.argv = ["overhead_calls.py", *(a for a in args if a != "--warm-probe")]
    oc.main()  # its first line counts nothing here (no profiler)
    print("stage (µs per call)                                          calls    p50   mean  cpu p50")
    for label, values in times.items():
        values.sort()
        spent = sorted(cpu.get(label, ()))
        on_cpu = f"{spent[len(spent) // 2] * 1e6:8.0f}" if spent else ""
        print(f"{label:60s} {len(values):5d} {values[len(values) // 2] * 1e6:6.0f} {sum(values) / len(values) * 1e6:6.0f}{on_cpu}")


if __name__ == "__main__":
    main()
