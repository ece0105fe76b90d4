"""The short-session rule under the cost model (issue 29): a view goes upstream untouched only
while the conversation is under ``view_target_ratio`` of the budget (and the triggers), so the
cost model's early events start once it outgrows the size an event settles at, not at the
trigger. With ``cost_model = false`` the triggers alone decide, as before. On every wire format
the first request whose upstream view compacted a tool result is checked against the client's
tokens and budget the gateway recorded for it."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.keys import LEDGER
from tests.ops.test_admin import TOKEN, get
from tests.pipeline.formats import WIRES, main_requests, run_loop
from tests.pipeline.test_early_events import MARK, results
from tests.support.agent import settle

BALANCED_TRIGGER = min(0.75, 0.65)  # balanced: min(summary_trigger_ratio, compact_trigger_ratio)
BALANCED_TARGET = 0.1  # balanced: view_target_ratio


async def _first_compaction(wire, upstream, start_gateway, policy: dict) -> tuple[list[dict], int]:
    """The turn log's rows and the index of the first request whose upstream view carried a
    compacted tool result."""
    gw = await start_gateway(server={"admin_token": TOKEN}, policy=policy)
    async with aiohttp.ClientSession() as http:
        _, answers = await run_loop(wire, http, gw.root, "s-gate", 30)
    await settle(gw)
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "s-gate")
    status, detail = await get(gw, f"/admin/sessions/{record.key}")
    assert status == 200 and all(a.status == 200 for a in answers)
    turns, sent = detail["turns"], main_requests(upstream, wire)
    assert len(turns) == len(sent) == 30
    first = next(i for i, body in enumerate(sent) if any(MARK in text for _, text in results(wire.path, body)))
    return turns, first


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_with_the_cost_model_planning_starts_past_the_settle_size(wire, upstream, start_gateway):
    turns, first = await _first_compaction(wire, upstream, start_gateway, {})
    # Compacted while the client's conversation was still under both triggers: only planning
    # past the settle size can have done that.
    assert turns[first]["client_tokens"] < BALANCED_TRIGGER * turns[first]["budget"]
    assert turns[first]["client_tokens"] > BALANCED_TARGET * turns[first]["budget"]
    # Requests under the settle size went as the client sent them.
    for turn in turns[:first]:
        if turn["client_tokens"] <= BALANCED_TARGET * turn["budget"]:
            assert turn["upstream_tokens"] == turn["client_tokens"]


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_without_the_cost_model_the_triggers_alone_gate(wire, upstream, start_gateway):
    turns, first = await _first_compaction(wire, upstream, start_gateway, {"cost_model": False})
    assert turns[first]["client_tokens"] > BALANCED_TRIGGER * turns[first]["budget"]
    assert all(t["upstream_tokens"] == t["client_tokens"] for t in turns[:first])
