"""Prefix stability (issue 29): between compaction events an agent loop's upstream prompt only
grows, on every wire format. Each consecutive pair of views the upstream received is either an
append (the previous prompt kept whole, element by element as the provider's cache matches it)
or a planned event (a result turned placeholder, a checkpoint adopted, the recall tools offered
with the first event); nothing else early in the view (a placeholder's text, the tools, the
instructions, a gateway block) changes between requests (bench/prefix_breaks.py classifies)."""

from __future__ import annotations

import aiohttp
import pytest

from bench.prefix_breaks import chat_elements, classify
from simulator.messages_rules import blocks
from simulator.responses_input import as_items, count_context
from tests.pipeline.formats import WIRES, main_requests, run_loop
from tests.support.agent import settle


def elements(name: str, body: dict, secret: bytes) -> list[tuple[bytes, int]]:
    """A body as its provider's prompt cache matches it, element by element."""
    if name == "chat":
        return chat_elements(body)
    if name == "responses":
        return count_context(body.get("instructions"), as_items(body.get("input")), body.get("tools"), secret)
    return [(key, tokens) for key, tokens, _ in blocks(body)]


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_an_agent_loop_s_views_only_append_between_events(start_gateway, upstream, wire):
    gw = await start_gateway()
    async with aiohttp.ClientSession() as http:
        _, answers = await run_loop(wire, http, gw.root, f"churn-{wire.name}", 24)
    await settle(gw)
    sent = main_requests(upstream, wire)
    assert len(sent) == len(answers) == 24  # one upstream call per step: no recall round here
    views = [elements(wire.name, body, upstream.state.secret) for body in sent]
    pairs = [classify(a, b) for a, b in zip(views, views[1:])]
    kinds = [p["class"] for p in pairs]
    assert "churn" not in kinds, [(n, p["tag"]) for n, p in enumerate(pairs) if p["class"] == "churn"]
    assert kinds.count("event") >= 3 and kinds.count("growth") >= 3, kinds  # the loop was compacted
    for a, b, pair in zip(views, views[1:], pairs):
        if pair["class"] == "growth":
            assert b[:len(a)] == a  # the previous prompt whole, then only new elements
