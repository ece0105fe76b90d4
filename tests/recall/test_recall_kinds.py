"""A question that names the kind of a hidden value ("which release ...") and no word of the
line holding it comes back through the recall loop on every wire format, and the index's kind
words (store/kinds.py) never reach the model: the upstream receives the line as written."""

from __future__ import annotations

import aiohttp
import pytest

from tests.pipeline.formats import TOOL_NAME, WIRES
from tests.support.agent import settle

FACT = "NOTE runtime pinned to gunicorn 21.2.0 behind the balancer"
STEPS = 24


def output(step: int) -> str:
    lines = [f"line{step}-{i} build ok module_{step}_{i} passed in stage {i % 7}" for i in range(150)]
    if step == 2:
        lines.insert(75, FACT)
    if step < STEPS:
        lines.append(f"[[call {TOOL_NAME} {{\"command\": \"step {step + 1}\"}}]]")
    return "\n".join(lines)


def sent(upstream, wire) -> list[dict]:
    return [r["json"] for r in upstream.received
            if r["path"].split("?")[0] == wire.path and r.get("json")
            and r["headers"].get("x-palimpsest-purpose") != "summary"]


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_question_naming_the_kind_of_a_hidden_value_gets_it_back(wire, upstream, start_gateway):
    gw = await start_gateway(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    async with aiohttp.ClientSession() as http:
        history = wire.start(f"Run the chain. [[call {TOOL_NAME} {{\"command\": \"step 1\"}}]]")
        for step in range(1, STEPS + 1):
            answer = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-kinds")
            assert answer.status == 200 and answer.calls, (step, answer.body)
            wire.add_answer(history, answer)
            wire.add_result(history, answer.calls[0][0], output(step))
        reply = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-kinds")
        wire.add_answer(history, reply)
        await settle(gw)
        wire.add_user(history, "RECALL: which release of the web server are we on?")
        before = len(sent(upstream, wire))
        answer = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-kinds")
    assert answer.status == 200
    rounds = str(sent(upstream, wire)[before:])
    # The line came back, by proactive recall (the block before the question) or by the
    # model's search, as the event holds it, with none of the index's kind words.
    assert "21.2.0" in answer.text
    assert FACT in rounds
    assert "\u27e6" not in rounds and "kindversion" not in rounds
