"""``TokenCounter.count_path`` (policies/tokens.py): a path's tokens from the longest leading part
summed before; always the figure counting every message gives, and a message edited in an earlier
request's history is counted afresh (issue 25: the view builder's estimate of a resent history)."""

from __future__ import annotations

import random

from policies.tokens import PATH_LOOK_BACK, PATH_STRIDE, REPLY_PRIMING, TokenCounter
from store.canonical import path_ids


def messages(n: int, tag: str = "") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} message {i} " + "word " * (i % 7)}
            for i in range(n)]


def full(history: list[dict]) -> int:
    return TokenCounter().count_messages(history, path_ids(history)) - REPLY_PRIMING


def counting(monkeypatch, counter: TokenCounter) -> list:
    counted: list = []
    real = counter.count_message
    monkeypatch.setattr(counter, "count_message", lambda m, k=None: counted.append(k) or real(m, k))
    return counted


def test_an_edited_earlier_message_is_counted_afresh():
    counter = TokenCounter()
    history = messages(300)
    assert counter.count_path(history, path_ids(history)) == full(history)
    for at in (0, 5, PATH_STRIDE - 1, PATH_STRIDE, 150, 298, 299):
        edited = [dict(m) for m in history]
        edited[at]["content"] += " and a much longer tail than before, " * 20
        want = full(edited)
        assert want > full(history)
        assert counter.count_path(edited, path_ids(edited)) == want
        # and the next step of the edited path, one message longer
        longer = [*edited, {"role": "user", "content": "next"}]
        assert counter.count_path(longer, path_ids(longer)) == full(longer)
    assert counter.count_path(history, path_ids(history)) == full(history)


def test_branches_steps_and_retries_agree_with_the_full_count(monkeypatch):
    rng = random.Random(25)
    counter = TokenCounter()
    base = messages(400)
    for _ in range(60):
        cut = rng.randrange(1, len(base))
        history = base[:cut]
        if rng.random() < 0.4:  # another branch off the shared history (a new last message)
            history = [*history, {"role": "user", "content": f"branch {rng.random()}"}]
        assert counter.count_path(history, path_ids(history)) == full(history)
    other = messages(120, "other")
    assert counter.count_path(other, path_ids(other)) == full(other)


def test_a_resent_history_counts_only_what_it_added(monkeypatch):
    counter = TokenCounter()
    counted = counting(monkeypatch, counter)
    base = messages(500)
    ids = path_ids(base)
    counter.count_path(base[:450], ids[:450])
    counted.clear()
    counter.count_path(base[:453], ids[:453])  # the agent's next step: three messages more
    assert counted == ids[450:453]
    counted.clear()
    # A branch off the history far from any earlier end: from the last kept stride, not from 0.
    branch = [*base[:300], {"role": "user", "content": "a new question"}]
    branch_ids = path_ids(branch)
    counter.count_path(branch, branch_ids)
    assert 0 < len(counted) <= PATH_STRIDE + 1 and counted[-1] == branch_ids[-1]
    counted.clear()
    assert counter.count_path(branch, branch_ids) == full(branch)
    assert counted == []  # resent as is
    counted.clear()
    far = base[:450 + PATH_LOOK_BACK + 10]
    counter.count_path(far, ids[:len(far)])  # many messages past the last end: from the kept strides
    assert len(counted) <= PATH_LOOK_BACK + 10 + PATH_STRIDE


def test_a_sibling_of_the_last_message_counts_one_message(monkeypatch):
    """A regenerated or edited last message branches off the message before it: that sum is kept
    at every count, so the sibling is counted alone, and agrees with the full count."""
    counter = TokenCounter()
    counted = counting(monkeypatch, counter)
    base = messages(457)  # the end's parent off every kept stride
    first = [*base, {"role": "user", "content": "the question"}]
    counter.count_path(first, path_ids(first))
    for n in range(3):
        counted.clear()
        sibling = [*base, {"role": "user", "content": f"the question, asked again ({n})"}]
        sibling_ids = path_ids(sibling)
        assert counter.count_path(sibling, sibling_ids) == full(sibling)
        assert counted == sibling_ids[-1:]


def test_ids_and_messages_must_pair():
    counter = TokenCounter()
    try:
        counter.count_path(messages(3), path_ids(messages(2)))
    except ValueError:
        return
    raise AssertionError("a path with fewer ids than messages was summed")
