"""`Ledger.sync` of an agent's next step (the message before the last one known to this process,
the last not): the last message is inserted without a look-up first, and the ledger ends up as
a look-up and insert would leave it, when another process wrote that message in between too, and
when the transaction fails between its statements."""

from __future__ import annotations

import sqlite3

import pytest

from store.ledger import Ledger, SessionRef


def _messages(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(n)]


def _rows(path) -> tuple[list, list]:
    db = sqlite3.connect(str(path / "ledger.sqlite3"))
    try:
        events = db.execute("SELECT session_key, id, parent, seq, role, kind, message FROM events ORDER BY seq").fetchall()
        sessions = db.execute("SELECT key, events, head, requests, model FROM sessions").fetchall()
    finally:
        db.close()
    return events, sessions


def _step(ledger: Ledger, ref: SessionRef, history: list[dict]) -> tuple[list[dict], list[str]]:
    """A request, its answer, and the next request's history (the answer and a new user message)."""
    ids = ledger.sync(ref, history, model="m").ids
    ledger.append(ref, ids[-1], {"role": "assistant", "content": f"answer {len(history)}"})
    return [*history, {"role": "assistant", "content": f"answer {len(history)}"},
            {"role": "user", "content": f"next {len(history)}"}], ids


def test_the_next_step_is_inserted_without_a_look_up(tmp_path):
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    history, _ = _step(ledger, ref, _messages(3))
    seen: list[str] = []
    ledger._db.set_trace_callback(seen.append)
    synced = ledger.sync(ref, history, model="m")
    ledger._db.set_trace_callback(None)
    assert synced.added == 1
    assert not [s for s in seen if s.startswith("SELECT 1 FROM events")]  # no look-up of the new message
    ledger.close()
    events, sessions = _rows(tmp_path)
    assert [e[3] for e in events] == list(range(5))  # 3 messages, the answer (resent: known), the new one
    assert [e[1] for e in events][-1] == synced.ids[-1] and events[-1][2] == synced.ids[-2]
    assert sessions == [(ref.key, 5, synced.ids[-1], 2, "m")]


def test_a_step_another_process_wrote_in_between_is_not_written_twice(tmp_path):
    mine, other = Ledger(tmp_path), Ledger(tmp_path)
    ref = SessionRef("t", "s")
    history, _ = _step(mine, ref, _messages(3))
    assert other.sync(ref, history, model="m").added == 1  # the other process wrote the step first
    synced = mine.sync(ref, history, model="m")
    assert synced.added == 0
    # The next answer and step go on at the session's next seq (its unique index would refuse a taken one).
    mine.append(ref, synced.ids[-1], {"role": "assistant", "content": "later"})
    assert mine.sync(ref, [*history, {"role": "assistant", "content": "later"}, {"role": "user", "content": "again"}],
                     model="m").added == 1
    mine.close(), other.close()
    events, sessions = _rows(tmp_path)
    assert [e[3] for e in events] == list(range(len(events)))
    assert len({e[1] for e in events}) == len(events) == 7
    assert sessions[0][1] == 7 and sessions[0][3] == 4  # events counted once; four requests


class _FailingUpdate:
    """The ledger's connection, failing the session's update after the event's insert."""

    def __init__(self, db) -> None:
        self._db = db

    def execute(self, sql, *args):
        if sql.startswith("UPDATE sessions SET events"):
            raise sqlite3.OperationalError("disk I/O error")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def test_a_step_that_fails_between_its_statements_leaves_nothing(tmp_path):
    ledger = Ledger(tmp_path)
    ref = SessionRef("t", "s")
    history, _ = _step(ledger, ref, _messages(3))
    before = _rows(tmp_path)
    real = ledger._db
    ledger._db = _FailingUpdate(real)
    with pytest.raises(sqlite3.OperationalError):
        ledger.sync(ref, history, model="m")
    ledger._db = real
    assert _rows(tmp_path) == before  # rolled back: no event without its session count
    assert ledger.sync(ref, history, model="m").added == 1  # and not taken for known
    ledger.close()
    events, sessions = _rows(tmp_path)
    assert [e[3] for e in events] == list(range(5)) and sessions[0][1] == 5


def test_a_new_sessions_row_is_written_whole_with_its_first_events(tmp_path):
    """A first sync inserts the session's row with its count, head, request and model (no
    insert then update); the row is what the insert-and-update left, and later syncs and the
    answer's append move it as before."""
    ledger = Ledger(tmp_path)
    statements: list[str] = []
    ledger._db.set_trace_callback(statements.append)
    ref = SessionRef("t", "fresh")
    ids = ledger.sync(ref, _messages(3), model="m1").ids
    assert [s.split()[0] for s in statements if "sessions" in s] == ["SELECT", "INSERT"]
    record = ledger.session(ref.key)
    assert (record.events, record.head, record.requests, record.model) == (3, ids[-1], 1, "m1")
    assert record.created == record.updated
    ledger._db.set_trace_callback(None)
    answer = ledger.append(ref, ids[-1], {"role": "assistant", "content": "a"})
    ids = ledger.sync(ref, [*_messages(3), {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
                      model="m2").ids
    events, sessions = _rows(tmp_path)
    assert [e[3] for e in events] == [0, 1, 2, 3, 4] and events[3][1] == answer.id
    assert sessions == [(ref.key, 5, ids[-1], 2, "m2")]
