"""One recall loop serves every format: what it learns about a model (that its upstream refuses
tools) holds for the process, whatever API the next request comes in."""

from __future__ import annotations

from gateway.keys import MESSAGES, PIPELINE, RESPONSES
from gateway.pipeline.recall_loop import RecallLoop


async def test_the_three_pipelines_share_one_recall_loop(start_gateway):
    gw = await start_gateway()
    loops = {id(pipeline.loop) for pipeline in (gw.app[PIPELINE], gw.app[RESPONSES].pipeline, gw.app[MESSAGES])}
    assert len(loops) == 1 and isinstance(gw.app[PIPELINE].loop, RecallLoop)
    assert type(gw.app[PIPELINE].loop) is RecallLoop  # no format subclasses it
