"""A question that names the kind of a hidden value ("which release ...") and no word of the
line holding it comes back through the recall loop on every wire format, and the index's kind
words (store/kinds.py) never reach the model: the upstream receives the line as written."""

from __future__ import annotations

import aiohttp
import pytest

from tests.pipeline.formats import TOOL_NAME, WIRES, ask_back
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


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_question_naming_the_kind_of_a_hidden_value_gets_it_back(wire, upstream, start_gateway):
    gw = await start_gateway(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    async with aiohttp.ClientSession() as http:
        answer, sent = await ask_back(wire, http, gw.root, "s-kinds", [output(step) for step in range(1, STEPS + 1)],
                                      "RECALL: which release of the web server are we on?",
                                      upstream=upstream, settle=lambda: settle(gw))
    assert answer.status == 200
    rounds = str(sent)
    # The line came back, by proactive recall (the block before the question) or by the
    # model's search, as the event holds it, with none of the index's kind words.
    assert "21.2.0" in answer.text
    assert FACT in rounds
    assert "\u27e6" not in rounds and "kindversion" not in rounds
