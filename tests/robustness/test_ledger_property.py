"""The ledger under any sequence of branching histories (hypothesis): whatever order clients sync
paths in (resends, edits that fork, regenerated answers, identical messages under different
parents), every path reads back exactly, each message is stored once per position, and the
store reopens to the same state. Store-level, no gateway: fast enough for a few hundred cases."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import HealthCheck, given, settings, strategies as st

from store.canonical import canonical_message, path_ids
from store.ledger import Ledger, SessionRef

MESSAGE = st.builds(
    lambda role, text: {"role": role, "content": text},
    st.sampled_from(["user", "assistant", "user", "tool"]),
    st.sampled_from(["hi", "ok", "again", "the same text", "🙂", "x" * 50]),  # few texts: repeats on purpose
)


@st.composite
def histories(draw):
    """Paths that share prefixes: each new path forks an earlier one at some point."""
    paths: list[list[dict]] = []
    for _ in range(draw(st.integers(1, 8))):
        if paths and draw(st.booleans()):
            base = draw(st.sampled_from(paths))
            prefix = base[: draw(st.integers(0, len(base)))]
        else:
            prefix = []
        path = prefix + draw(st.lists(MESSAGE, min_size=0 if prefix else 1, max_size=5))
        if path:
            paths.append(path)
    resend = draw(st.lists(st.integers(0, len(paths) - 1), max_size=4))  # clients resend old paths too
    paths = paths + [paths[i] for i in resend]
    # After some requests the gateway records the upstream's answer (deferred or not).
    answers = [draw(st.sampled_from([None, None, "now", "deferred"])) for _ in paths]
    return paths, answers


def _canon(m: dict) -> bytes:
    return orjson.dumps(canonical_message(m), option=orjson.OPT_SORT_KEYS)


def _check(ledger: Ledger, key: str, paths: list[list[dict]]) -> None:
    events = ledger.since(key, -1)
    ids = [e.id for e in events]
    assert len(ids) == len(set(ids))  # one row per content address
    seqs = sorted(e.seq for e in events)
    assert seqs == list(range(len(seqs))), seqs  # insertion order without holes or repeats
    expected = {i for path in paths for i in path_ids(path)}
    assert set(ids) == expected  # nothing lost, nothing extra
    record = ledger.session(key)
    assert record is not None and record.events == len(events)
    for path in paths:
        stored = ledger.path_to(key, path_ids(path)[-1])
        assert [_canon(e.message) for e in stored] == [_canon(m) for m in path]
    heads = set(ledger.heads(key))
    parents = {e.parent for e in events}
    assert heads == {i for i in ids if i not in parents}


COUNTER = itertools.count()


@settings(derandomize=True, database=None, deadline=None, max_examples=250, suppress_health_check=list(HealthCheck))
@given(histories(), st.booleans())
def test_any_branching_history_reads_back_exactly(tmp_path_factory, drawn, defer_answers):
    paths, answers = drawn
    root = tmp_path_factory.getbasetemp() / "ledger-property"
    ref = SessionRef("tenant", f"s{next(COUNTER)}")
    ledger = Ledger(root, defer_answers=defer_answers)
    expected = []
    try:
        for path, answer in zip(paths, answers):
            synced = ledger.sync(ref, path)
            assert synced.ids == path_ids(path)
            expected.append(path)
            if answer is not None:
                message = {"role": "assistant", "content": f"answer to {len(path)}"}
                ledger.append(ref, synced.ids[-1], message, defer=answer == "deferred")
                expected.append(path + [message])
        _check(ledger, ref.key, expected)
    finally:
        ledger.close()
    reopened = Ledger(root)  # what a restarted gateway sees
    try:
        _check(reopened, ref.key, expected)
    finally:
        reopened.close()
