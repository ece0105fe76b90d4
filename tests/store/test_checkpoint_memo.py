"""The embedded checkpoint store's per-process memo across processes sharing one directory:
a session another process deleted, recreated or summarised is read afresh (a deleted session's
summary must never come back for a new session under the same key), while a memo hit still
reads no diskcache row. Two store instances on one directory are two SQLite connections, as two
processes would be; one case runs a real second process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from store import open_stores
from store.records import SessionRef

from tests.store.test_checkpoint_new_session import other_process

REF = SessionRef("t", "s")
HELLO = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


def stores(path):
    return open_stores(SimpleNamespace(path=str(path), sync="normal", url=None))


def add(checkpoints, boundary: str, summary: str):
    return checkpoints.add(REF.key, boundary=boundary, summary=summary, state={}, covered_tokens=10, covered_events=1,
                           model="m", mode="async", previous=None, summary_tokens=3)


def counting_reads(checkpoints) -> list:
    reads: list = []
    real_get = checkpoints._cache.get  # noqa: SLF001 (counting the store's reads)
    checkpoints._cache.get = lambda *a, **k: reads.append(a) or real_get(*a, **k)  # noqa: SLF001
    return reads


def test_a_session_deleted_elsewhere_does_not_bring_its_summary_back(tmp_path):
    (ledger_a, ours), (ledger_b, theirs) = stores(tmp_path), stores(tmp_path)
    boundary = ledger_a.sync(REF, HELLO).ids[-1]
    add(ours, boundary, "private summary")
    assert [cp.summary for cp in ours.list(REF.key)] == ["private summary"]  # memoised here
    theirs.delete_session(REF.key)  # the admin deletion, in the other process (checkpoints, then ledger)
    ledger_b.delete_session(REF.key)
    assert ours.list(REF.key) == []
    assert ours.newest_on_path(REF.key, {boundary: 0}) is None
    # The same key starts again (the same first messages, so the same boundary id) and is summarised there.
    ledger_b.sync(REF, HELLO)
    add(theirs, boundary, "new summary")
    assert [cp.summary for cp in ours.list(REF.key)] == ["new summary"]
    # A summary this process writes now follows the new one, not the deleted one.
    add(ours, boundary, "next")
    assert [(cp.summary, cp.version) for cp in ours.list(REF.key)] == [("new summary", 1), ("next", 2)]


@pytest.mark.parametrize("mapped", [True, False], ids=["wal-index header", "pragma only"])
def test_a_checkpoint_added_elsewhere_is_listed(tmp_path, mapped):
    (ledger_a, ours), (_, theirs) = stores(tmp_path), stores(tmp_path)
    assert ours._shm is not None  # noqa: SLF001 (the store's WAL-index header is mapped)
    if not mapped:
        ours._shm = None  # noqa: SLF001 (as without a -shm file: every look asks SQLite)
    boundary = ledger_a.sync(REF, HELLO).ids[-1]
    add(ours, boundary, "first")
    assert [cp.summary for cp in ours.list(REF.key)] == ["first"]
    add(theirs, boundary, "second")
    assert [(cp.summary, cp.version) for cp in ours.list(REF.key)] == [("first", 1), ("second", 2)]
    assert ours.newest_on_path(REF.key, {boundary: 0})[0].summary == "second"


def test_a_second_process_deletion_is_seen(tmp_path):
    ledger, checkpoints = stores(tmp_path)
    boundary = ledger.sync(REF, HELLO).ids[-1]
    add(checkpoints, boundary, "private summary")
    assert len(checkpoints.list(REF.key)) == 1
    other_process(tmp_path, f"""
        checkpoints.delete_session({REF.key!r})
        ledger.delete_session({REF.key!r})
    """)
    assert checkpoints.list(REF.key) == []


def test_a_memo_hit_reads_no_row_and_own_writes_keep_the_memo(tmp_path):
    ledger, checkpoints = stores(tmp_path)
    boundary = ledger.sync(REF, HELLO).ids[-1]
    add(checkpoints, boundary, "first")
    checkpoints.acquire_lease("summary:" + REF.key, "me", 30)  # this process's own commits
    reads = counting_reads(checkpoints)
    add(checkpoints, boundary, "second")
    checkpoints.release_lease("summary:" + REF.key, "me")
    before = len(reads)
    for _ in range(3):
        assert [cp.summary for cp in checkpoints.list(REF.key)] == ["first", "second"]
    assert len(reads) == before  # served from the memo: no diskcache read per request


def test_a_list_read_before_a_drop_is_not_remembered(tmp_path):
    """A load another thread began before the memo was dropped may be stale: it is returned,
    not remembered."""
    ledger, checkpoints = stores(tmp_path)
    boundary = ledger.sync(REF, HELLO).ids[-1]
    add(checkpoints, boundary, "first")
    generation = checkpoints._generation  # noqa: SLF001
    checkpoints._memo.clear()  # noqa: SLF001
    checkpoints._generation += 1  # noqa: SLF001 (a drop by another thread)
    checkpoints._remember(REF.key, (), generation)  # noqa: SLF001
    assert REF.key not in checkpoints._memo  # noqa: SLF001
    assert [cp.summary for cp in checkpoints.list(REF.key)] == ["first"]


def test_a_session_first_read_here_then_summarised_elsewhere_is_read_again(tmp_path):
    """A miss reads the store without asking whether the memo holds; the next list (a hit)
    asks, and finds the other process's commit."""
    (ledger_a, ours), (_, theirs) = stores(tmp_path), stores(tmp_path)
    other = SessionRef("t", "other")
    ours.list(other.key), ours.list(other.key)  # a miss, then a hit: this thread's connection has looked
    boundary = ledger_a.sync(REF, HELLO).ids[-1]
    add(theirs, boundary, "first")
    assert [cp.summary for cp in ours.list(REF.key)] == ["first"]  # a miss: read
    add(theirs, boundary, "second")
    assert [cp.summary for cp in ours.list(REF.key)] == ["first", "second"]  # a hit: the commit seen
    reads = counting_reads(ours)
    assert [cp.summary for cp in ours.list(REF.key)] == ["first", "second"] and reads == []


class _Counting:
    """The store's diskcache with each use of a thread's connection counted."""

    def __init__(self, cache) -> None:
        self.cache, self.uses = cache, 0

    @property
    def _con(self):
        self.uses += 1
        return self.cache._con  # noqa: SLF001

    def __getattr__(self, name):
        return getattr(self.cache, name)


def test_a_memo_hit_with_nothing_committed_makes_no_sqlite_call(tmp_path):
    """The WAL-index header unchanged says nobody committed: no pragma. Once it moved (another
    connection's commit) the pragma runs, and the memo is read again."""
    (ledger, ours), (_, theirs) = stores(tmp_path), stores(tmp_path)
    boundary = ledger.sync(REF, HELLO).ids[-1]
    add(ours, boundary, "first")
    ours.list(REF.key)
    ours._cache = counting = _Counting(ours._cache)  # noqa: SLF001
    for _ in range(3):
        assert [cp.summary for cp in ours.list(REF.key)] == ["first"]
    assert counting.uses == 0
    add(theirs, boundary, "second")
    assert [cp.summary for cp in ours.list(REF.key)] == ["first", "second"]
    assert counting.uses >= 1
