"""A big request that resends a recent one but for its tail (an agent's next step) is handled on
the event loop: its parse comes from the memos, its history's token count from the counter's
path sums, and the ledger holds all but its last messages, so none of the three is worth a
thread hop (gateway/pipeline/offload.py; issue 25's pass-through overhead). A new or edited
history still goes to worker threads. Either way the upstream receives the same bytes and the
view counts the same tokens as counting every message afresh."""

from __future__ import annotations

import threading

import aiohttp
import orjson
import pytest

from gateway.pipeline import history_ids, offload
from gateway.pipeline.views import View, ViewBuilder
from store.ledger import Ledger
from tests.pipeline.formats import WIRES, run_loop
from tests.support.agent import settle

MODEL = "fake-1000k"


def on_loop() -> bool:
    return threading.current_thread() is threading.main_thread()


@pytest.fixture
def where(monkeypatch):
    """(step, ran on the loop thread, extra) for each parse, view step and ledger sync."""
    seen: list[tuple] = []
    real_ids = history_ids.HISTORY_IDS.ids
    monkeypatch.setattr(history_ids.HISTORY_IDS, "ids", lambda h, size: seen.append(("parse", on_loop(), size)) or real_ids(h, size))
    real_begin, real_finish, real_sync = ViewBuilder.begin, ViewBuilder.finish, Ledger.sync

    async def begin(self, chat, ref, auth=None):
        begun = await real_begin(self, chat, ref, auth)
        view = begun if isinstance(begun, View) else begun.view
        seen.append(("begin", on_loop(), view.raw_estimate))
        return begun

    async def finish(self, chat, ref, auth, begun):
        seen.append(("finish", on_loop(), None))
        return await real_finish(self, chat, ref, auth, begun)

    def sync(self, ref, messages, ids=None, model=None):
        seen.append(("sync", on_loop(), len(messages)))
        return real_sync(self, ref, messages, ids, model)

    monkeypatch.setattr(ViewBuilder, "begin", begin)
    monkeypatch.setattr(ViewBuilder, "finish", finish)
    monkeypatch.setattr(Ledger, "sync", sync)
    return seen


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_resent_big_history_stays_on_the_loop_and_a_new_one_does_not(start_gateway, upstream, wire, where):
    # A 1M window and no cost model: no summary, the view stays the client's.
    gw = await start_gateway(policy={"cost_model": False}, models={MODEL: {"context_window": 1_000_000}})
    async with aiohttp.ClientSession() as http:
        history, _ = await run_loop(wire, http, gw.root, "big", 5, tokens=12_000, model=MODEL)
        await settle(gw)

        async def send(hist, session="big"):
            raw = orjson.dumps(wire.body(hist, stream=False, model=MODEL))
            assert len(raw) >= offload.BIG_BODY_BYTES
            where.clear()
            answer = await wire.post(http, gw.root, {}, raw=raw, session=session)
            assert answer.status == 200, answer.body
            await settle(gw)
            return raw, answer, list(where)

        # The next step: the history as the last request sent it, plus a question.
        wire.add_user(history, "And now the summary, please.")
        raw, answer, seen = await send(history)
        assert [(step, loop) for step, loop, _ in seen] == [("parse", True), ("begin", True), ("sync", True)], seen
        assert upstream.received[-1]["body"] == raw  # forwarded byte for byte
        steps = {step: extra for step, _, extra in seen}

        # An earlier message edited: parsed, counted and synced off the loop, counted afresh.
        edited = orjson.loads(orjson.dumps(history))
        wire.add_user(edited, "x")  # keeps the roles' order valid for every format
        target = next(m for m in edited if m.get("role") == "user")  # the first message of the path
        if isinstance(target.get("content"), str):
            target["content"] += " (edited: " + "more words " * 200 + ")"
        else:
            target["content"][0]["text"] += " (edited: " + "more words " * 200 + ")"
        raw2, _, seen2 = await send(edited)
        assert [(step, loop) for step, loop, _ in seen2] == [("parse", False), ("begin", False), ("sync", False)], seen2
        assert upstream.received[-1]["body"] == raw2
        estimate2 = next(extra for step, _, extra in seen2 if step == "begin")
        estimate1 = steps["begin"]
        assert estimate2 > estimate1 + 100  # the edit's ~400 tokens are counted, not a stale sum
