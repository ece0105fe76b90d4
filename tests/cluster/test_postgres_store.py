"""The PostgreSQL ledger and checkpoints against a real PostgreSQL: the embedded store's
semantics (the same tests run on both), and what replicas add: two stores on one database
see each other's writes at once, serialise on one session, and share leases."""

from __future__ import annotations

import threading
import time

import pytest

from store.checkpoints import DiskCheckpoints
from store.ledger import Ledger, SessionRef

CONVERSATION = [
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "one"},
    {"role": "user", "content": "second"},
    {"role": "assistant", "content": "two"},
    {"role": "user", "content": "third"},
]


@pytest.fixture(params=["embedded", "postgres"])
def stores(request, tmp_path):
    """A factory of (ledger, checkpoints) pairs on ONE shared store: each call is a replica."""
    opened = []
    if request.param == "embedded":
        def make():
            pair = (Ledger(tmp_path), DiskCheckpoints(tmp_path))
            opened.append(pair)
            return pair
    else:
        url = request.getfixturevalue("pg_url")
        from store.postgres import PostgresLedger
        from store.postgres_checkpoints import PostgresCheckpoints

        def make():
            pair = (PostgresLedger(url, max_connections=4), PostgresCheckpoints(url))
            opened.append(pair)
            return pair
    make.kind = request.param
    yield make
    for ledger, checkpoints in opened:
        checkpoints.close()
        ledger.close()


def add_cp(checkpoints, key, boundary, summary="s"):
    return checkpoints.add(key, boundary=boundary, summary=summary, state={"paths": ["/a"]}, covered_tokens=10,
                           covered_events=2, model="m", mode="async", previous=None, summary_tokens=3)


def test_sync_appends_only_new_messages_and_counts_requests(stores):
    ledger, _ = stores()
    ref = SessionRef("t", "s")
    first = ledger.sync(ref, CONVERSATION[:1], model="m1")
    assert first.added == 1
    grown = ledger.sync(ref, CONVERSATION, model="m2")
    assert grown.added == 4 and grown.ids[0] == first.ids[0]
    assert ledger.sync(ref, CONVERSATION).added == 0
    events = ledger.since(ref.key, -1)
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert [e.message["content"] for e in events] == [m["content"] for m in CONVERSATION]
    record = ledger.session(ref.key)
    assert (record.events, record.requests, record.head, record.model) == (5, 3, grown.ids[-1], None)
    assert [r.key for r in ledger.sessions("t")] == [ref.key] and ledger.sessions("other") == []


def test_edit_forks_and_answers_and_side_events(stores):
    ledger, _ = stores()
    ref = SessionRef("t", "fork")
    ids = ledger.sync(ref, CONVERSATION[:3]).ids
    answer = ledger.append(ref, ids[-1], {"role": "assistant", "content": "two"}, defer=True)
    # The resent history lands on the answer's event: nothing new.
    assert ledger.sync(ref, CONVERSATION[:4]).added == 0
    edited = CONVERSATION[:2] + [{"role": "user", "content": "second, edited"}]
    assert ledger.sync(ref, edited).added == 1
    assert len(ledger.heads(ref.key)) == 2
    assert len(ledger.children(ref.key, ids[1])) == 2
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "session_search", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "found"}
    first = ledger.add_side_events(ref, answer.id, [call, result])
    again = ledger.add_side_events(ref, answer.id, [call, result])  # an identical round stays distinct
    assert len({e.id for e in first + again}) == 4
    assert [e.kind for e in ledger.side_events(ref.key, answer.id)] == ["side"] * 4
    assert ledger.children(ref.key, answer.id) == ()  # side events never join a path
    assert [e.id for e in ledger.path_to(ref.key, answer.id)] == ids + [answer.id]


def test_a_second_replica_sees_writes_at_once_and_a_delete_is_not_hidden_by_its_cache(stores):
    (a, _), (b, _) = stores(), stores()
    ref = SessionRef("t", "shared")
    a.sync(ref, CONVERSATION[:3])
    assert b.sync(ref, CONVERSATION[:3]).added == 0  # b sees a's events
    assert b.sync(ref, CONVERSATION).added == 2
    assert len(a.since(ref.key, -1)) == 5
    # a deletes; b's known-event cache holds these ids, and must not skip them.
    assert a.delete_session(ref.key) == 5
    assert b.sync(ref, CONVERSATION).added == 5
    assert [e.seq for e in a.since(ref.key, -1)] == [0, 1, 2, 3, 4]


def test_concurrent_syncs_of_one_session_from_two_replicas_never_duplicate_or_lose(stores):
    replicas = [stores()[0] for _ in range(2)]
    ref = SessionRef("t", "race")
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(40)]
    errors = []

    def client(ledger, offset):
        try:
            for n in range(1 + offset, len(history) + 1, 1):
                ledger.sync(ref, history[:n])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    # PostgreSQL stores are called from worker threads (store.call); an embedded one from its loop.
    per_replica = 2 if stores.kind == "postgres" else 1
    threads = [threading.Thread(target=client, args=(r, i)) for i, r in enumerate(replicas) for _ in range(per_replica)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    events = replicas[0].since(ref.key, -1)
    assert [e.message["content"] for e in events] == [m["content"] for m in history]
    assert [e.seq for e in events] == list(range(len(history)))
    assert replicas[1].session(ref.key).events == len(history)


def test_checkpoints_written_by_one_replica_are_read_by_another(stores):
    (la, ca), (_, cb) = stores(), stores()
    ref = SessionRef("t", "cp")
    ids = la.sync(ref, CONVERSATION).ids
    assert cb.list(ref.key) == []  # b has looked (an embedded memo would now be stale)
    cp = add_cp(ca, ref.key, ids[1])
    seen = cb.list(ref.key)
    if stores.kind == "embedded":
        pytest.skip("the embedded memo is per process: replicas need PostgreSQL")
    assert [c.id for c in seen] == [cp.id]
    found, pos = cb.newest_on_path(ref.key, {eid: i for i, eid in enumerate(ids)})
    assert (found.id, pos) == (cp.id, 1)
    second = add_cp(cb, ref.key, ids[3])
    assert [c.version for c in ca.list(ref.key)] == [1, 2] and ca.list(ref.key)[1].id == second.id
    assert ca.delete_session(ref.key) == 2 and cb.list(ref.key) == []


def test_one_checkpoint_per_boundary_even_when_two_replicas_race(pg_url):
    from store.postgres_checkpoints import PostgresCheckpoints

    a, b = PostgresCheckpoints(pg_url), PostgresCheckpoints(pg_url)
    first = add_cp(a, "t/x", "boundary-1", "from a")
    second = add_cp(b, "t/x", "boundary-1", "from b")
    assert second.id == first.id and second.summary == "from a"
    assert len(b.list("t/x")) == 1
    a.close()
    b.close()


def test_summary_lease_is_held_by_one_replica_and_expires_when_its_holder_dies(stores):
    (_, a), (_, b) = stores(), stores()
    assert a.acquire_lease("t/s", "replica-a", 30)
    assert not b.acquire_lease("t/s", "replica-b", 30)
    assert a.acquire_lease("t/s", "replica-a", 30)  # renewal by the holder
    a.release_lease("t/s", "replica-a")
    assert b.acquire_lease("t/s", "replica-b", 0.2)  # b takes it, then "dies" without releasing
    assert not a.acquire_lease("t/s", "replica-a", 30)
    time.sleep(0.4)
    assert a.acquire_lease("t/s", "replica-a", 30)


def test_postgres_schema_is_versioned_and_replicas_migrate_once(pg_url):
    import psycopg

    from store.migrations import PG_VERSION
    from store.postgres import PostgresLedger

    ledgers = []
    threads = [threading.Thread(target=lambda: ledgers.append(PostgresLedger(pg_url, max_connections=2))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ledgers) == 3
    with psycopg.connect(pg_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, PG_VERSION + 1))
    for ledger in ledgers:
        ledger.close()


def test_retention_lists_idle_sessions(stores):
    ledger, _ = stores()
    ledger.sync(SessionRef("t", "idle"), CONVERSATION[:1])
    assert ledger.expired(time.time() - 60) == []
    assert ledger.expired(time.time() + 1) == [SessionRef("t", "idle").key]


def test_both_backends_implement_the_store_interfaces(stores):
    from store.interfaces import CheckpointStore, LedgerStore

    ledger, checkpoints = stores()
    assert isinstance(ledger, LedgerStore) and isinstance(checkpoints, CheckpointStore)
    assert ledger.blocking is (stores.kind == "postgres") and checkpoints.blocking is (stores.kind == "postgres")
    ledger.ping()


def test_holds_answers_for_the_session_and_its_incarnation(stores):
    ledger, _ = stores()
    ref = SessionRef("t", "holds")
    ids = ledger.sync(ref, CONVERSATION).ids
    assert all(ledger.holds(ref.key, eid) for eid in ids)
    assert not ledger.holds(ref.key, "ev_missing") and not ledger.holds("t:other", ids[0])
    ledger.delete_session(ref.key)
    assert not ledger.holds(ref.key, ids[0])


def test_path_to_walks_up_to_the_root(stores):
    ledger, _ = stores()
    ref = SessionRef("t", "path")
    ids = ledger.sync(ref, CONVERSATION).ids
    edited = CONVERSATION[:2] + [{"role": "user", "content": "other branch"}]
    other = ledger.sync(ref, edited).ids
    assert [e.id for e in ledger.path_to(ref.key, ids[-1])] == ids
    assert [e.id for e in ledger.path_to(ref.key, other[-1])] == other
    assert ledger.path_to(ref.key, "ev_missing") == []


@pytest.mark.parametrize("kind", ["embedded", "postgres"])
def test_response_ids_are_per_tenant_and_replicas_share_them_and_the_secret(kind, tmp_path, request):
    from store.interfaces import ResponseIdStore
    from store.response_ids import ResponseIds

    if kind == "postgres":
        from store.postgres_responses import PostgresResponseIds

        url = request.getfixturevalue("pg_url")
        one, two = PostgresResponseIds(url), PostgresResponseIds(url)
    else:
        one = two = ResponseIds(tmp_path)
    try:
        assert isinstance(one, ResponseIdStore) and one.secret() == two.secret() and len(one.secret()) == 32
        one.remember("alice", "resp_1", "alice/s", "ev_a")
        two.remember("bob", "resp_1", "bob/s", "ev_b")  # the same id for another tenant takes nothing over
        assert two.find("alice", "resp_1").event_id == "ev_a" and one.find("bob", "resp_1").event_id == "ev_b"
        assert one.find("carol", "resp_1") is None and one.taken("resp_1") and not one.taken("resp_2")
        one.remember("alice", "resp_1", "alice/s", "ev_a2")  # the same tenant again: the newest wins
        assert two.find("alice", "resp_1").event_id == "ev_a2"
        two.forget("alice", "resp_1")
        assert one.find("alice", "resp_1") is None and one.find("bob", "resp_1") is not None
        assert one.delete_session("bob/s") == 1 and not two.taken("resp_1")
        # The output items of recorded answers: whose an item_reference is, kept with the answer.
        one.remember("alice", "resp_2", "alice/s", "ev_c", ["msg_1", "rs_1"])
        two.remember("bob", "resp_3", "", "", ["msg_1"])
        assert two.item_owners(["msg_1", "rs_1", "msg_2", "msg_1"]) == {
            "msg_1": frozenset({"alice", "bob"}), "rs_1": frozenset({"alice"})}
        assert one.item_owners([]) == {} and len(one.item_owners([f"m{n}" for n in range(1200)] + ["rs_1"])) == 1
        two.delete_session("alice/s")
        assert one.item_owners(["msg_1", "rs_1"]) == {"msg_1": frozenset({"bob"})}
    finally:
        one.close()
        two.close() if two is not one else None
