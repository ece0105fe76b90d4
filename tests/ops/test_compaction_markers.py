"""The turn log's ``compaction_event`` flag (the inspector's and ``palimpsest replay --html``'s
markers) against what the upstream really received, on every wire format: a request is marked
exactly when its view compacted tool results the previous request still sent raw, through an
agent loop where early compaction events fire (issue 29's interval rule)."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.keys import LEDGER
from tests.ops.test_admin import TOKEN, get
from tests.pipeline.formats import WIRES, main_requests, run_loop
from tests.pipeline.test_early_events import MARK, results
from tests.support.agent import settle


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_markers_are_the_requests_whose_view_compacted_more(wire, upstream, start_gateway):
    gw = await start_gateway(server={"admin_token": TOKEN})
    async with aiohttp.ClientSession() as http:
        _, answers = await run_loop(wire, http, gw.root, "s-markers", 40)
    await settle(gw)
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "s-markers")
    status, detail = await get(gw, f"/admin/sessions/{record.key}")
    assert status == 200
    turns = detail["turns"]
    sent = main_requests(upstream, wire)
    assert len(turns) == len(sent) == len(answers) == 40
    compacted: set[str] = set()
    seen = []
    for body in sent:
        now = {cid for cid, text in results(wire.path, body) if MARK in text}
        seen.append(bool(now - compacted))
        compacted |= now
    assert sum(seen) >= 3  # early events fired
    assert [t["compaction_event"] for t in turns] == seen
