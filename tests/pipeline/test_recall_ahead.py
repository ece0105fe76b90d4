"""Proactive recall (recall.auto_tokens) on all three formats: the recalled-history block is
planned into the view before it is fitted, so the view's figures (the
``x-palimpsest-prompt-tokens-upstream`` header, the receipt's estimate, what calibration learns
from) are those of the prompt the upstream received, block included, and within the budget.

Before the planner (issue 25), the block was added after the view's tokens were counted: the
header and receipt left it out."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.pipeline.formats import WIRES, run_loop
from tests.pipeline.test_parity import ECONOMY, main_requests
from tests.support.agent import settle

pytestmark = pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
BLOCK = "<recalled_history>"


async def test_a_proactive_recall_block_counts_in_the_view_it_joins(wire, upstream, start_gateway):
    gw = await start_gateway(policy=ECONOMY, recall={"auto_tokens": 800, "auto_timeout_s": 60})  # a slow machine still searches
    async with aiohttp.ClientSession() as http:
        history, _ = await run_loop(wire, http, gw.root, "s-ahead", 24)
        reply = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-ahead")
        assert reply.status == 200 and not reply.calls
        wire.add_answer(history, reply)
        await settle(gw)
        wire.add_user(history, "Quick check before we go on: where is the artifact for step 2?")
        before = len(main_requests(upstream, wire))
        answer = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-ahead")
        assert answer.status == 200
        async with http.get(f"{gw.root}/v1/palimpsest/receipts/{answer.headers['x-palimpsest-receipt']}",
                            headers=wire.headers("sk-client", None)) as r:
            assert r.status == 200
            receipt = await r.json()
    sent = main_requests(upstream, wire)[before]
    assert BLOCK in orjson.dumps(sent).decode()  # the block went up, and the receipt itemises it
    prompt = receipt["prompt"]
    assert prompt["by_kind"].get("recalled_history", 0) > 100
    # The receipt's items are the counter's count of what the upstream received; the view's
    # estimate is that count calibrated (the format's wire framing aside).
    counted = prompt["tokens"] - prompt["by_kind"].get("wire_framing", 0)
    estimate = int(answer.headers["x-palimpsest-prompt-tokens-upstream"])
    assert estimate == prompt["upstream_estimate"]
    assert abs(estimate - prompt["calibration"] * counted) <= 0.002 * counted + 2, (estimate, counted)
    assert estimate <= receipt["budget"]
