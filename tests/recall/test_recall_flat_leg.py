"""A question whose only word in common with the session is one that many events hold (a kind
word on every .py path of every directory listing, store/kinds.py) does not hand the model an
arbitrary listing: the keyword leg that cannot tell its events apart counts little
(`Ranking.text_margin`, issue 28), and the fact whose line holds the question's words comes back,
on every wire format."""

from __future__ import annotations

import random

import aiohttp
import pytest

from tests.pipeline.formats import TOOL_NAME, WIRES, ask_back
from tests.support.agent import settle

FACT = "NOTE the migration lives in /srv/app/migrations/0042_add_ledger.py"
VALUE = "/srv/app/migrations/0042_add_ledger.py"
STEPS = 24
DIRS = ("worker", "cache", "queue", "render", "shard", "client", "stream", "parser", "socket", "branch")


def output(step: int) -> str:
    rng = random.Random(step)
    if step == 2:  # a build log with the fact on one line, no path elsewhere
        lines = [f"2024-06-{i % 28 + 1:02d} INFO build worker queue stage {i % 7} ok" for i in range(150)]
        lines.insert(75, FACT)
    else:  # a directory listing: every line a .py path, so every line carries "script"
        lines = [f"-rw-r--r-- 1 app app {rng.randint(100, 99999):>6} Jun {rng.randint(1, 28):>2} "
                 f"/srv/app/{rng.choice(DIRS)}/{rng.choice(DIRS)}_{i}.py" for i in range(120)]
    if step < STEPS:
        lines.append(f"[[call {TOOL_NAME} {{\"command\": \"step {step + 1}\"}}]]")
    return "\n".join(lines)


@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_word_on_every_listing_does_not_outrank_the_line_that_answers(wire, upstream, start_gateway):
    gw = await start_gateway(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    async with aiohttp.ClientSession() as http:
        # No word of the fact's line but "script", which the index gives every .py path.
        answer, rounds = await ask_back(wire, http, gw.root, "s-flat", [output(step) for step in range(1, STEPS + 1)],
                                        "RECALL: which scripts carry the relocation?",
                                        upstream=upstream, settle=lambda: settle(gw))
    assert answer.status == 200
    # The fact was hidden from the view the model got, and came back as the answer.
    assert VALUE not in str(rounds[0]["messages"] if "messages" in rounds[0] else rounds[0].get("input"))
    assert VALUE in answer.text
