"""A fact named in the question's own word order ("back-end programming languages") comes back
ahead of notes that repeat each of the question's words apart, on every wire format: the keyword
leg counts words, not their order, and the phrase bonus (`Ranking.phrase`, issue 28) tells the
two apart."""

from __future__ import annotations

import re

import aiohttp
import pytest

from gateway.recall.auto import CLOSE, OPEN

from tests.pipeline.formats import TOOL_NAME, WIRES, ask_back
from tests.support.agent import settle

FACT = "Tip from the mentor: learn a back-end programming language such as Elixir before anything else."
STEPS = 24
TOPICS = ("Django", "Rails", "Laravel", "Spring", "Phoenix", "Express")


def output(step: int) -> str:
    lines = [f"line{step}-{i} build ok module_{step}_{i} passed in stage {i % 7}" for i in range(150)]
    if step == 3:
        lines.insert(75, FACT)
    else:  # more of the question's words on one line than the fact's line holds, none of its phrases
        topic = TOPICS[step % len(TOPICS)]
        lines.insert(75, f"notes {step}: back-end services in {topic}; the front-end calls programming "
                         f"interfaces in several languages")
    if step < STEPS:
        lines.append(f"[[call {TOOL_NAME} {{\"command\": \"step {step + 1}\"}}]]")
    return "\n".join(lines)


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_the_fact_in_the_questions_word_order_outranks_notes_repeating_its_words(wire, upstream, start_gateway):
    gw = await start_gateway(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    async with aiohttp.ClientSession() as http:
        answer, rounds = await ask_back(wire, http, gw.root, "s-phrase", [output(step) for step in range(1, STEPS + 1)],
                                        "RECALL: which back-end programming languages did the notes recommend?",
                                        upstream=upstream, settle=lambda: settle(gw))
    assert answer.status == 200
    # The fact was hidden from the view the model got (but for the proactive recall block, when
    # its search answered in time), and the search's first hit, the one the simulated model
    # answers from, was it.
    first = str(rounds[0].get("messages") or rounds[0].get("input"))
    assert FACT not in re.sub(re.escape(OPEN) + ".*?" + re.escape(CLOSE), "", first, flags=re.S)
    assert "Elixir" in answer.text
