"""The answer's write to the embedded ledger after a big request (issue 25): SQL statements and
CPU time of ``Ledger.append`` with its own commit, the same deferred (``defer_answers``) with
what the next request's sync then pays, and a Responses id's ``remember``.

    PYTHONPATH=$PWD python bench/answer_append.py --n 300

A session of 450 messages of ~1 KB is synced, then each step appends an answer and syncs the
next request (answer + a user message), as an agent loop does. Statement counts are exact;
times are CPU p50 and move with the machine's load.

``--statements`` also prints each ledger statement's wall p50 in a third own-commit loop, and a probe
after each COMMIT (``bench/overhead_stages.py --warm-probe``'s: the same transaction on a warm
path), to set against the same rows measured inside the gateway.
"""

from __future__ import annotations

import argparse
import collections
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The tree measured: PYTHONPATH's when set (a baseline worktree), else this checkout.
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.canonical import path_ids  # noqa: E402
from store.ledger import Ledger  # noqa: E402
from store.records import SessionRef  # noqa: E402
from store.response_ids import ResponseIds  # noqa: E402
from sql_probe import WrappedConnection, probe_after_commit  # noqa: E402


class TimedStatements(WrappedConnection):
    """The ledger's connection with each statement's wall time kept by its text (values left out)."""

    def __init__(self, db: sqlite3.Connection, times: dict[str, list[float]]) -> None:
        super().__init__(db)
        self._times = times

    def _timed(self, method, sql: str, *args):
        started = time.perf_counter()
        try:
            return method(sql, *args)
        finally:
            self._times[" ".join(sql.split())[:60]].append(time.perf_counter() - started)
            if sql == "COMMIT":
                probe_after_commit(self._db, self._times)


def loop(ledger: Ledger, n: int) -> tuple[int, float, float]:
    """(SQL statements of one append, append CPU ms p50, next sync CPU ms p50)."""
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "x" * 1000} for i in range(450)]
    ref = SessionRef("tenant", "session")
    ledger.sync(ref, history, path_ids(history), "model")
    statements: list[str] = []
    appends, syncs, counted = [], [], 0
    for k in range(n):
        ids = path_ids(history)
        answer = {"role": "assistant", "content": f"answer {k}"}
        ledger._db.set_trace_callback(statements.append)  # noqa: SLF001 (a benchmark reads the connection)
        statements.clear()
        t0 = time.process_time()
        ledger.append(ref, ids[-1], answer, defer=True)
        appends.append(time.process_time() - t0)
        counted = len(statements)
        ledger._db.set_trace_callback(None)  # noqa: SLF001
        history = [*history, answer, {"role": "user", "content": f"next {k}"}]
        ids = path_ids(history)
        t0 = time.process_time()
        ledger.sync(ref, history, ids, "model")
        syncs.append(time.process_time() - t0)
    return counted, statistics.median(appends) * 1e3, statistics.median(syncs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--statements", action="store_true", help="each ledger statement's wall p50 (and a warm probe)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="answer-append-"))
    statements: dict[str, list[float]] = collections.defaultdict(list)
    own = loop(Ledger(root / "own"), args.n)
    if args.statements:  # a loop of its own: the probes' statements would be counted above
        timed = Ledger(root / "timed")
        timed._db = TimedStatements(timed._db, statements)  # type: ignore[assignment]  # noqa: SLF001
        loop(timed, args.n)
    deferred = loop(Ledger(root / "deferred", defer_answers=True), args.n)
    ids = ResponseIds(root / "responses")
    remember = []
    for k in range(args.n):
        t0 = time.process_time()
        ids.remember("tenant", f"resp_{k}", "tenant/session", "e" * 64)
        remember.append(time.process_time() - t0)
    print(f"answer append, own commit: {own[0]} SQL statements, CPU p50 {own[1]:.3f} ms; next sync {own[2]:.3f} ms")
    print(f"answer append, deferred:   {deferred[0]} SQL statements, CPU p50 {deferred[1]:.3f} ms; next sync {deferred[2]:.3f} ms")
    print(f"response id remember: CPU p50 {statistics.median(remember) * 1e3:.3f} ms")
    for label, values in statements.items():
        if label.startswith("probe") or len(values) >= args.n:
            print(f"  {label:62s} {len(values):5d} wall p50 {statistics.median(values) * 1e6:6.1f} µs")


if __name__ == "__main__":
    main()
