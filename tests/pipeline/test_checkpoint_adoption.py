"""A summary checkpoint is adopted at the first compaction event after it was stored, on every
wire format. A background summary job can finish while the session's next request is already
under way; that request's view was built without it, so replaying the same stored path later
(a retry, another replica, the next request) must not adopt it at an event that came earlier.
The simulator holds every summary call until the test opens its gate, so the race is forced,
not waited for."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.pipeline.formats import TOOL_NAME, WIRES, main_requests, step_output
from tests.support.agent import settle

# Summaries whenever the view passes the trigger, whatever the cost model would decide.
SUMMARIES = {"profile": "economy", "summary_trigger_ratio": 0.3, "cost_model": False}


def summary_calls(upstream) -> int:
    return sum(r["headers"].get("x-palimpsest-purpose") == "summary" for r in upstream.received)


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_summary_stored_during_a_request_is_not_adopted_by_its_replay(wire, upstream, start_gateway):
    gate = asyncio.Event()
    upstream.state.summary_gate = gate  # every summary call waits here
    gw = await start_gateway(policy=SUMMARIES)
    async with aiohttp.ClientSession() as http:
        history = wire.start(f"Run the chain. [[call {TOOL_NAME} {{\"command\": \"step 1\"}}]]")
        held = None
        for step in range(1, 40):
            body = wire.body(history, stream=False)
            answer = await wire.post(http, gw.root, body, session="s-race")
            assert answer.status == 200 and answer.calls, (step, answer.status, answer.body)
            if held is not None:
                break  # this request went upstream while the summary job was held
            await asyncio.sleep(0.05)  # the job is started after the answer
            if summary_calls(upstream):
                held = step
            wire.add_answer(history, answer)
            wire.add_result(history, answer.calls[0][0], step_output(step, 1800))
        assert held is not None, "the chain never called for a summary"
        during = main_requests(upstream, wire)[-1]
        assert "<session_summary>" not in str(during)  # nothing to adopt yet

        gate.set()  # the summary lands after that request's view was built
        await settle(gw)
        retry = await wire.post(http, gw.root, body, session="s-race")
        assert retry.status == 200
        again = main_requests(upstream, wire)[-1]
        # The retry replays the same stored path: same view, same cached prefix, no summary yet.
        assert again == during

        # The checkpoint is not lost: the chain goes on and a later compaction event adopts it.
        wire.add_answer(history, retry)
        for step in range(held + 1, held + 20):
            wire.add_result(history, retry.calls[0][0], step_output(step, 1800))
            retry = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-race")
            assert retry.status == 200 and retry.calls
            if "<session_summary>" in str(main_requests(upstream, wire)[-1]):
                break
            wire.add_answer(history, retry)
        else:
            raise AssertionError("the stored checkpoint was never adopted")
