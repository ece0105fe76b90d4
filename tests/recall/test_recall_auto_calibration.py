"""Proactive recall and the token calibration, on all three wire formats (raw HTTP against the
strict simulator on fake-32k).

The calibration learns the ratio between the gateway's token estimate of a view and the prompt
tokens the upstream reports for it. A proactive recall block (recall.auto_tokens) grows the view
after it was estimated; when the estimate did not count the block, every request carrying one
taught the calibration that the tokenizer counts more than it does, so every later budget,
compaction and summary decision of the session moved with whether (and how fast) a search
answered. That is how the pinned-rules revocation test came to pass or fail with the machine's
load and with changes to the search's passages (issue 28, the revert 68acb99 of recall2).
"""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from gateway.recall.auto import OPEN
from simulator.standing import ROUTES, play
from simulator.workloads import synthetic_session
from simulator.puppet import create_puppet_app
from tests.conftest import Upstream, _serve
from tests.support.agent import settle

ECONOMY = {"profile": "economy"}


def _text_of(part) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        content = part.get("content", part.get("text"))
        if isinstance(content, list):
            return "".join(_text_of(p) for p in content)
        return content if isinstance(content, str) else ""
    return ""


def without_recall_blocks(fmt: str, body: dict) -> tuple[list, int]:
    """The view's conversation with the proactive recall blocks taken out, and how many there were."""
    items = body.get("messages") if fmt != "responses" else body.get("input")
    kept, found = [], 0
    for item in items or []:
        content = item.get("content")
        if isinstance(content, list):
            parts = [p for p in content if not _text_of(p).startswith(OPEN)]
            found += len(content) - len(parts)
            if not parts:
                continue
            item = {**item, "content": parts}
        elif _text_of(item).startswith(OPEN):
            found += 1
            continue
        kept.append(item)
    return kept, found


async def views_of(start_gateway, tmp_path, fmt: str, auto_tokens: int) -> tuple[list[str], list[list], int]:
    """Play one tool-heavy session on a fresh simulator and store of its own; what the upstream
    received, in order: per request 'view' or 'summary', the client views without recall blocks,
    and how many blocks there were."""
    runner, port = await _serve(create_puppet_app(windows={"fake-32k": 32_000}))
    upstream = Upstream(runner.app, runner, f"http://127.0.0.1:{port}/v1")
    try:
        # A generous timeout: every search answers in time, so the blocks are there on every fresh question.
        gw = await start_gateway(policy=ECONOMY, recall={"auto_tokens": auto_tokens, "auto_timeout_s": 120},
                                 upstream={"base_url": upstream.base_url}, store={"path": str(tmp_path / f"auto{auto_tokens}")})
        async with aiohttp.ClientSession() as http:
            assert set(await play(http, gw.base_url, fmt, synthetic_session(2, rounds=24), f"cal-{fmt}")) == {200}
        await settle(gw)
        received = upstream.received
    finally:
        await runner.cleanup()
    kinds, views, blocks = [], [], 0
    for r in received:
        if r["headers"].get("x-palimpsest-purpose") == "summary":
            kinds.append("summary")
        elif r["path"].endswith(ROUTES[fmt]) and r.get("json"):
            kinds.append("view")
            view, found = without_recall_blocks(fmt, r["json"])
            views.append(view)
            blocks += found
    return kinds, views, blocks


@pytest.mark.parametrize("fmt", ["chat", "responses", "messages"])
async def test_a_proactive_recall_block_moves_no_later_decision_of_the_session(start_gateway, tmp_path, fmt):
    kinds_on, views_on, blocks_on = await views_of(start_gateway, tmp_path, fmt, 600)
    kinds_off, views_off, blocks_off = await views_of(start_gateway, tmp_path, fmt, 0)
    assert blocks_off == 0 and blocks_on >= 5  # the blocks were there: this compares something
    assert "summary" in kinds_off  # the session is long enough to be summarised
    # The same summaries at the same requests, and the same views but for the blocks.
    assert kinds_on == kinds_off
    # The same views but for the blocks: as many messages each (placeholders, summaries and
    # the raw tail alike). Not byte for byte: the simulator's model reads its scripted tool
    # call off the newest user message, which on Messages holds the block too.
    assert [len(v) for v in views_on] == [len(v) for v in views_off]
    if fmt != "messages":
        assert [orjson.dumps(v) for v in views_on] == [orjson.dumps(v) for v in views_off]
