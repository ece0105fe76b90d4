"""A new session's checkpoint lookup (issue 25): the embedded stores skip diskcache's read when
the ledger has no row for the session, since a checkpoint is only ever written from a session's
events, which are committed with its row first. Checked against a second process writing the
same store directory."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

from store import open_stores
from store.checkpoints import DiskCheckpoints
from store.ledger import Ledger
from store.records import SessionRef

ROOT = Path(__file__).resolve().parents[2]


def settings(path: Path) -> SimpleNamespace:
    return SimpleNamespace(path=str(path), sync="normal", url=None)


def other_process(path: Path, script: str) -> None:
    """Run `script` in a second Python process with its own stores on the same directory."""
    prelude = f"from store import open_stores\nfrom types import SimpleNamespace\nfrom store.records import SessionRef\n" \
              f"ledger, checkpoints = open_stores(SimpleNamespace(path={str(path)!r}, sync='normal', url=None))\n"
    subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script)], cwd=ROOT, check=True, timeout=60,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def add(checkpoints, session_key: str, boundary: str):
    return checkpoints.add(session_key, boundary=boundary, summary="summary", state={}, covered_tokens=10, covered_events=1,
                           model="m", mode="async", previous=None, summary_tokens=3)


def test_a_new_session_lists_no_checkpoints_without_reading_diskcache(tmp_path):
    ledger, checkpoints = open_stores(settings(tmp_path))
    reads = []
    real_get = checkpoints._cache.get  # noqa: SLF001 (counting the store's reads)
    checkpoints._cache.get = lambda *a, **k: reads.append(a) or real_get(*a, **k)  # noqa: SLF001
    assert checkpoints.list("t/new") == []
    assert reads == []
    ledger.sync(SessionRef("t", "old"), [{"role": "user", "content": "hello"}])
    assert checkpoints.list(SessionRef("t", "old").key) == []
    assert len(reads) == 1  # a session with a ledger row is read from diskcache, as before


def test_a_second_process_checkpoint_is_seen(tmp_path):
    """Another process syncs a session and writes its checkpoint; this process, which has not
    listed the session yet, finds it (the ledger row says the session exists)."""
    ledger, checkpoints = open_stores(settings(tmp_path))
    other_process(tmp_path, """
        sync = ledger.sync(SessionRef("t", "s"), [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
        checkpoints.add(SessionRef("t", "s").key, boundary=sync.ids[-1], summary="from b", state={}, covered_tokens=10,
                        covered_events=2, model="m", mode="async", previous=None, summary_tokens=3)
        ledger.close()
    """)
    key = SessionRef("t", "s").key
    assert ledger.has_session(key)
    found = checkpoints.list(key)
    assert [cp.summary for cp in found] == ["from b"]
    assert found[0].boundary == ledger.session(key).head


def test_a_checkpoint_without_a_ledger_row_is_not_listed(tmp_path):
    """A checkpoint whose session has no ledger row (a summary that finished after the session
    was deleted) is not listed for a session of that key: the store without the ledger's
    answer (`has_session=None`, as tests and tools open it) still reads it."""
    ledger, checkpoints = open_stores(settings(tmp_path))
    other_process(tmp_path, """
        checkpoints.add("t/orphan", boundary="ev1", summary="orphan", state={}, covered_tokens=10, covered_events=1,
                        model="m", mode="async", previous=None, summary_tokens=3)
    """)
    assert not ledger.has_session("t/orphan")
    assert checkpoints.list("t/orphan") == []
    plain = DiskCheckpoints(tmp_path)
    assert [cp.summary for cp in plain.list("t/orphan")] == ["orphan"]


def test_has_session_sees_another_connections_commit(tmp_path):
    ours, theirs = Ledger(tmp_path), Ledger(tmp_path)
    key = SessionRef("t", "s").key
    assert not ours.has_session(key)
    theirs.sync(SessionRef("t", "s"), [{"role": "user", "content": "hello"}])
    assert ours.has_session(key)
    assert not ours.has_session(SessionRef("t", "other").key)


def test_a_checkpoint_added_here_for_a_new_session_is_listed(tmp_path):
    """The first list of a new session remembers none; the summary this process then writes
    (after the session's sync) is listed from the memo."""
    ledger, checkpoints = open_stores(settings(tmp_path))
    ref = SessionRef("t", "s")
    assert checkpoints.list(ref.key) == []
    sync = ledger.sync(ref, [{"role": "user", "content": "hello"}])
    add(checkpoints, ref.key, sync.ids[-1])
    assert [cp.boundary for cp in checkpoints.list(ref.key)] == [sync.ids[-1]]
