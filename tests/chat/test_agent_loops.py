"""Agent loops through the gateway: one user message, then dozens of tool calls.

Every upstream request is checked for tool pairing and window fit; inside one long turn the
old results must become placeholders and a summary may cover part of the turn, while the task
(the turn's user message) and the client's system prompt go up verbatim.
"""

from __future__ import annotations

import statistics

import openai

from gateway.keys import CHECKPOINTS, LEDGER
from policies.rounds import tool_pair_problems
from simulator.puppet import count_prompt
from simulator.workloads import TOOL_SPECS, agent_loop_session
from tests.support.agent import drive_loop, settle

WINDOW = 32_000


def client(gw, session):
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": session}, max_retries=0)


def forwarded(upstream) -> list[dict]:
    return [r["json"] for r in upstream.chat_requests() if not r["headers"].get("x-palimpsest-purpose")]


def assert_valid_and_fits(bodies: list[dict]) -> None:
    for body in bodies:
        conversation = [m for m in body["messages"] if m["role"] not in ("system", "developer")]
        assert tool_pair_problems(conversation) == []
        assert count_prompt(body) + (body.get("max_tokens") or 0) <= WINDOW


async def run_loop(gw, upstream, session, name: str):
    """Drive the loop through the gateway; every request answered, every upstream body valid and
    fitting. Returns the client's history, its raw responses and the forwarded bodies."""
    history, raw = await drive_loop(client(gw, name), session, model="fake-32k")
    await settle(gw)
    assert all(r.http_response.status_code == 200 for r in raw)
    bodies = forwarded(upstream)
    assert_valid_and_fits(bodies)
    return history, raw, bodies


def is_placeholder(message: dict) -> bool:
    return message["role"] == "tool" and str(message.get("content", "")).startswith("[Tool result compacted by the gateway]")


async def test_long_turn_is_compacted_in_place_and_settles_below_the_window(start_gateway, upstream):
    gw = await start_gateway()  # the default profile
    session = agent_loop_session(seed=3, turns=1, calls=64)
    history, raw, bodies = await run_loop(gw, upstream, session, "loop")
    assert len(raw) == 65 and len(bodies) == 65
    task = history[1]
    for body in bodies:
        assert body["messages"][0] == history[0]  # the client's system prompt, byte-identical
        assert body["tools"][: len(TOOL_SPECS)] == TOOL_SPECS  # and its tools, first
        assert task in body["messages"]  # the turn's user message always goes up verbatim
    # Placeholders appear inside the one long turn, and the newest results stay raw.
    with_placeholders = [b for b in bodies if any(is_placeholder(m) for m in b["messages"])]
    assert len(with_placeholders) >= 30
    assert not is_placeholder(bodies[-1]["messages"][-1]) and bodies[-1]["messages"][-1]["content"] == history[-2]["content"]
    # The view settles well below the window instead of parking at its edge.
    sizes = [count_prompt(b) for b in bodies]
    assert statistics.median(sizes[20:]) <= 0.5 * WINDOW and max(sizes) <= 0.7 * WINDOW
    # An event rewrites only the end of the prompt (the rounds it compacts; since issue 29 the
    # cost model compacts early and often when that is cheap): on average a request keeps
    # nearly all of the previous one as its prefix, which the provider's cache serves.
    def shared(prev: list, cur: list) -> int:
        return next((i for i, (a, b) in enumerate(zip(prev, cur)) if a != b), min(len(prev), len(cur)))
    kept = [shared(prev["messages"], cur["messages"]) / len(prev["messages"]) for prev, cur in zip(bodies, bodies[1:])]
    assert statistics.mean(kept) >= 0.9


async def test_summary_covers_part_of_the_current_turn_and_the_task_stays(start_gateway, upstream):
    # Economy with an early trigger, so summaries come while the turn is still running.
    gw = await start_gateway(policy={"profile": "economy", "summary_trigger_ratio": 0.3})
    session = agent_loop_session(seed=4, turns=2, calls=40)
    history, _, bodies = await run_loop(gw, upstream, session, "loop-summary")
    key = gw.app[LEDGER].sessions()[0].key
    checkpoints = gw.app[CHECKPOINTS].list(key)
    assert checkpoints
    ledger = gw.app[LEDGER]
    inside = [cp for cp in checkpoints if ledger.get(key, cp.boundary).message["role"] in ("tool", "assistant")
              and ledger.get(key, cp.boundary).message.get("tool_calls") is None]
    assert inside, "a checkpoint boundary lies inside a user turn (after a tool result)"
    tasks = [m for m in history if m["role"] == "user"]
    summarised = [b for b in bodies if len(b["messages"]) > 1 and b["messages"][1]["role"] == "system"
                  and b["messages"][1]["content"].startswith("<session_summary>")]
    assert summarised
    for body in summarised:
        assert body["messages"][0] == history[0]
        # Right after the block: the user message of the turn in progress, then its latest steps.
        current = [t for t in tasks if t in body["messages"]]
        assert current and body["messages"][2] == current[0]
    within_turn = [b for b in summarised if b["messages"][2] == tasks[-1] and b["messages"][3]["role"] == "assistant"
                   and b["messages"][-1]["role"] == "tool"]
    assert within_turn, "a summary covers part of the current turn while the loop runs"


async def test_a_new_summary_waits_for_the_next_compaction_event(start_gateway, upstream):
    # Summaries land between requests; each is adopted only by a request whose placeholders move
    # anyway, so the prompt prefix changes once per event instead of once more per summary.
    gw = await start_gateway()  # the default profile
    session = agent_loop_session(seed=5, turns=1, calls=64)
    _, _, bodies = await run_loop(gw, upstream, session, "loop-events")

    def block(body):
        second = body["messages"][1]
        return second["content"] if second["role"] == "system" and "<session_summary>" in second["content"] else None

    def placeholders(body):
        return sum(is_placeholder(m) for m in body["messages"])

    switches = [(prev, cur) for prev, cur in zip(bodies, bodies[1:]) if block(cur) != block(prev)]
    assert switches, "a summary folded the placeholders of the long turn"
    for prev, cur in switches:
        # The summary came with a compaction event: raw results became placeholders (or old
        # placeholders were folded into the summary) in the very same request.
        assert placeholders(cur) != placeholders(prev)
        # The event made the view smaller than appending the new round (the previous request plus
        # the newest call and result) would have: a summary is adopted only where it shrinks the view.
        appended = dict(prev, messages=[*prev["messages"], *cur["messages"][-2:]])
        assert count_prompt(cur) < count_prompt(appended)
    # Summaries are fewer than events: most events only move placeholders (since issue 29 the
    # cost model compacts early and often when that is cheap, and an event rewrites only the end
    # of the prompt: a request keeps nearly all of the previous one as its prefix).
    def shared(prev: list, cur: list) -> int:
        return next((i for i, (a, b) in enumerate(zip(prev, cur)) if a != b), min(len(prev), len(cur)))
    kept = [shared(prev["messages"], cur["messages"]) / len(prev["messages"]) for prev, cur in zip(bodies, bodies[1:])]
    assert statistics.mean(kept) >= 0.9
    events = sum(placeholders(cur) != placeholders(prev) for prev, cur in zip(bodies, bodies[1:]))
    assert len(switches) < events
