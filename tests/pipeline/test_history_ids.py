"""The history-id memo returns exactly what hashing from scratch returns, and reuses the work
of the previous big request when an agent resends its history."""

from __future__ import annotations

import random

from gateway.pipeline.history_ids import HistoryIds
from store.canonical import path_ids

BIG = 1 << 20


def history(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    for i in range(n):
        if i % 3 == 0:
            out.append({"role": "user", "content": f"step {i}: {rng.random()}"})
        elif i % 3 == 1:
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "shell", "arguments": f'{{"n": {i}}}'}}]})
        else:
            out.append({"role": "tool", "tool_call_id": f"c{i - 1}", "content": "x" * rng.randint(1, 50)})
    return out


def test_same_ids_as_hashing_from_scratch_whatever_came_before():
    memo = HistoryIds(min_bytes=0)
    base = history(1, 60)
    cases = [
        base,
        [*base, {"role": "user", "content": "one more"}],  # the agent's next step
        base[:40],  # a shorter resend
        [*base[:20], {"role": "user", "content": "edited"}, *base[21:]],  # a message changed mid-way
        history(2, 60),  # another conversation
        [{**base[0]}, *base[1:], {"role": "assistant", "content": "done"}],  # equal copies, not the same objects
    ]
    for case in cases:
        assert memo.ids(case, BIG) == path_ids(case)


def test_a_resent_history_is_not_hashed_again():
    memo = HistoryIds(min_bytes=0)
    base = history(3, 100)
    memo.ids(base, BIG)
    assert memo.reused == 0
    nxt = [*[dict(m) for m in base], {"role": "user", "content": "next"}]
    assert memo.ids(nxt, BIG) == path_ids(nxt)
    assert memo.reused == 100
    changed = [*nxt[:50], {"role": "user", "content": "forked here"}, *nxt[51:]]
    assert memo.ids(changed, BIG) == path_ids(changed)
    assert memo.reused == 150  # only the 50 equal messages before the change


def test_the_same_objects_then_equal_copies_are_all_reused():
    """A resent list's leading messages are the very objects of the last parse (the Responses
    memo); equal copies after them still count as resent, and a changed one ends the run."""
    memo = HistoryIds(min_bytes=0)
    base = history(5, 90)
    memo.ids(base, BIG)
    mixed = [*base[:30], *[dict(m) for m in base[30:60]], *base[60:], {"role": "user", "content": "next"}]
    assert memo.ids(mixed, BIG) == path_ids(mixed)
    assert memo.reused == 90
    changed = [*mixed[:40], {"role": "user", "content": "forked"}, *mixed[41:]]
    assert memo.ids(changed, BIG) == path_ids(changed)
    assert memo.reused == 130


def test_small_bodies_are_hashed_and_not_remembered():
    memo = HistoryIds(min_bytes=1000)
    base = history(4, 30)
    for _ in range(3):
        assert memo.ids(base, 10) == path_ids(base)
    assert memo.reused == 0 and memo._bytes == 0


def test_the_memo_stays_within_its_budget():
    memo = HistoryIds(min_bytes=0, budget_bytes=3000)
    for seed in range(20):
        h = history(100 + seed, 10)
        assert memo.ids(h, 1000) == path_ids(h)
        assert memo._bytes <= 3000
    assert len(memo._recent) == 3
    # A body over the whole budget is hashed but not kept.
    h = history(999, 10)
    assert memo.ids(h, 5000) == path_ids(h)
    assert memo._bytes <= 3000


def test_empty_history():
    assert HistoryIds(min_bytes=0).ids([], BIG) == []


# -- through the gateway, on every format ------------------------------------------------------

import aiohttp  # noqa: E402
import pytest  # noqa: E402

from gateway.keys import LEDGER  # noqa: E402
from gateway.pipeline.history_ids import HISTORY_IDS, MEMO_MIN_BYTES  # noqa: E402
from tests.pipeline.formats import WIRES, run_loop  # noqa: E402
from tests.support.agent import settle  # noqa: E402


async def _play(gw, wire, session: str) -> list[list[str]]:
    """Six ~40 KB tool results under a 1M window; the ledger's branches of the session, as the
    roles along each path."""
    async with aiohttp.ClientSession() as http:
        _, answers = await run_loop(wire, http, gw.root, session, 6, tokens=10_000, model="fake-1000k")
    assert all(a.status == 200 for a in answers)
    await settle(gw)
    ledger = gw.app[LEDGER]
    (record,) = [r for r in ledger.sessions() if r.session_id == session]
    return sorted([e.message.get("role") for e in ledger.path_to(record.key, head)] for head in ledger.heads(record.key))


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_an_agent_resending_a_big_history_is_recorded_as_without_the_memo(start_gateway, upstream, wire, monkeypatch):
    """From the third step on every body is over the memo's threshold and its resent prefix takes
    the remembered ids: the ledger records the session exactly as when every message is hashed
    again (the same branches, the same paths)."""
    gw = await start_gateway()
    monkeypatch.setattr(HISTORY_IDS, "min_bytes", 10**12)  # hash everything again
    hashed = await _play(gw, wire, f"hashed-{wire.name}")
    monkeypatch.setattr(HISTORY_IDS, "min_bytes", MEMO_MIN_BYTES)
    before = HISTORY_IDS.reused
    remembered = await _play(gw, wire, f"memo-{wire.name}")
    assert HISTORY_IDS.reused > before, "the resent prefix of a big body was hashed again"
    assert remembered == hashed and len(max(hashed, key=len)) >= 12
