"""`requests_on_ids` (gateway/jobs/pace.py): the client turns of a path counted on from a
remembered prefix give what a walk over the whole path gives, for agent loops resent turn by
turn, an edited early message, and ids that do not match the history."""

from __future__ import annotations

import random

from gateway.jobs import pace
from policies.cost import requests_on_path
from store.canonical import path_ids


def _step(rng: random.Random, history: list[dict], k: int) -> list[dict]:
    """One client request's worth of growth: an answer, then a user message or tool results."""
    added = []
    if rng.random() < 0.5:
        added.append({"role": "assistant", "content": f"answer {k}"})
        added.append({"role": "user", "content": f"question {k}"})
    else:
        added.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]})
        added += [{"role": "tool", "tool_call_id": f"c{k}", "content": f"out {k} {j}"} for j in range(rng.randint(1, 3))]
    return history + added


def test_resent_paths_count_as_a_full_walk(monkeypatch):
    walked: list[int] = []
    turns_after = pace.turns_after
    monkeypatch.setattr(pace, "turns_after", lambda history, *state: walked.append(len(history)) or turns_after(history, *state))
    rng = random.Random(7)
    for seed in range(5):
        history = [{"role": "system", "content": f"s{seed}"}, {"role": "user", "content": "start"}]
        for k in range(40):
            history = _step(rng, history, k)
            walked.clear()
            assert pace.requests_on_ids(history, path_ids(history)) == requests_on_path(history)
            assert sum(walked) <= 4 or k == 0  # only what this request added (after the first)


def test_a_sibling_branch_counts_from_a_stride(monkeypatch):
    """The bench's shape: each request is the shared history plus its own last exchange, not
    an extension of the previous request: counted on from the shared history's last stride."""
    walked: list[int] = []
    turns_after = pace.turns_after
    monkeypatch.setattr(pace, "turns_after", lambda history, *state: walked.append(len(history)) or turns_after(history, *state))
    shared = [{"role": "user", "content": "go"}]
    for k in range(100):
        shared = _step(random.Random(k), shared, k)
    for i in range(5):
        path = [*shared, {"role": "assistant", "content": "done"}, {"role": "user", "content": f"next {i}"}]
        walked.clear()
        assert pace.requests_on_ids(path, path_ids(path)) == requests_on_path(path)
        assert sum(walked) <= pace.TURNS_STRIDE + 2 or i == 0


def test_an_edited_message_is_counted_afresh():
    history = [{"role": "user", "content": "a"}]
    for k in range(10):
        history = _step(random.Random(k), history, k)
    pace.requests_on_ids(history, path_ids(history))
    edited = [{"role": "user", "content": "edited"}, {"role": "user", "content": "b"}, *history[1:]]
    assert pace.requests_on_ids(edited, path_ids(edited)) == requests_on_path(edited) == requests_on_path(history)


def test_ids_that_do_not_match_walk_the_history():
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert pace.requests_on_ids(history, None) == pace.requests_on_ids(history, ["x"]) == 2


def test_the_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(pace, "TURNS_MEMO", 8)
    monkeypatch.setattr(pace, "_turns", type(pace._turns)())
    for k in range(20):
        history = [{"role": "user", "content": f"q{k}"}]
        pace.requests_on_ids(history, path_ids(history))
    assert len(pace._turns) == 8
