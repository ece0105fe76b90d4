"""`Ledger.holds`: the existence check a big request's sync probe uses (gateway/pipeline/offload.py
light_sync). It answers from this process's known-events cache without SQL, else from the
primary key's index; another process's writes and deletes are seen, and a stale cached answer
never makes ``sync`` skip a write."""

from __future__ import annotations

from store.canonical import path_ids
from store.ledger import Ledger, SessionRef


def _messages(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def _statements(ledger: Ledger) -> list[str]:
    seen: list[str] = []
    ledger._db.set_trace_callback(seen.append)
    return seen


def test_holds_answers_from_the_cache_without_sql(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ref = SessionRef("t", "s")
    messages = _messages(4)
    ids = ledger.sync(ref, messages).ids
    answer = ledger.append(ref, ids[-1], {"role": "assistant", "content": "the answer"})
    seen = _statements(ledger)
    assert ledger.holds(ref.key, ids[0]) and ledger.holds(ref.key, answer.id)
    assert seen == []  # written by this process: known without a look-up
    assert not ledger.holds(ref.key, "ev_" + "0" * 24)
    assert not ledger.holds(SessionRef("t", "other").key, ids[0])
    assert seen and all("message" not in s.split("WHERE")[0] for s in seen)  # no event row read
    ledger.close()


def test_holds_sees_another_process(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    mine, other = Ledger(path), Ledger(path)
    ref = SessionRef("t", "s")
    messages = _messages(3)
    ids = other.sync(ref, messages).ids
    assert mine.holds(ref.key, ids[-1])  # written elsewhere: found by the index
    other.delete_session(ref.key)
    assert not mine.holds(ref.key, ids[-1])  # never cached here: asked again, and gone
    mine.close(), other.close()


def test_a_stale_answer_never_skips_a_write(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    mine, other = Ledger(path), Ledger(path)
    ref = SessionRef("t", "s")
    messages = _messages(4)
    ids = mine.sync(ref, messages[:3]).ids
    other.delete_session(ref.key)  # another process deletes the session this one cached
    other.sync(ref, messages[:1])  # and it starts again with a new incarnation
    synced = mine.sync(ref, messages)
    assert synced.ids == path_ids(messages)
    assert synced.added == 3  # the three messages the new incarnation lacks, not just the last
    assert [e.id for e in mine.path_to(ref.key, ids[-1])] == ids
    assert mine.holds(ref.key, synced.ids[-1]) and other.holds(ref.key, synced.ids[-1])
    mine.close(), other.close()


def test_delete_here_forgets(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ref = SessionRef("t", "s")
    ids = ledger.sync(ref, _messages(2)).ids
    ledger.delete_session(ref.key)
    assert not ledger.holds(ref.key, ids[0])
    ledger.close()


def test_get_many_is_one_query_in_the_order_asked(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ref = SessionRef("t", "s")
    messages = _messages(1200)
    ids = ledger.sync(ref, messages).ids
    missing = "ev_" + "f" * 24
    asked = [ids[5], missing, ids[2], ids[5], ids[1100]]
    seen = _statements(ledger)
    events = ledger.get_many(ref.key, asked)
    assert [e.id for e in events] == [ids[5], ids[2], ids[5], ids[1100]]
    assert [e.message["content"] for e in events] == ["message 5", "message 2", "message 5", "message 1100"]
    assert len([s for s in seen if s.startswith("SELECT")]) == 1
    assert [e == ledger.get(ref.key, e.id) for e in events] == [True] * 4  # as get reads them
    every = ledger.get_many(ref.key, reversed(ids))  # past SQLite's bound-variable limit: in chunks
    assert [e.id for e in every] == ids[::-1]
    assert ledger.get_many(ref.key, []) == [] and ledger.get_many(SessionRef("t", "other").key, ids[:3]) == []
    ledger.close()
