"""A long history arriving at once (issue 29, item 5), on every format: the one-shot question is
answered within the window with the recall tools and the exact values, and no summary call is
made for it, because folding a history the gateway never held is priced by the cost model
against the one request the session has run (policies/cost.requests_seen); once the session goes
on (a second request), its summary is written."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.keys import CHECKPOINTS, LEDGER, METRICS
from simulator.puppet import count_prompt
from simulator.workloads import synthetic_session

PLANTED = "Remember: the staging deploy id is DEP-58213."
QUESTION = "RECALL: What is the staging deploy id?"
SYSTEM = "You are a careful operations assistant."
RECALL_NAMES = {"session_search", "session_load"}


def pasted_history(seed: int = 6, rounds: int = 40) -> list[tuple[str, str]]:
    """(role, text) turns: the planted fact, then long pasted logs (~50k tokens), answered briefly."""
    turns = [("user", PLANTED), ("assistant", "noted")]
    for spec in synthetic_session(seed=seed, rounds=rounds).rounds:
        turns += [("user", "Here is a log:\n" + spec["output"]), ("assistant", "looked at it")]
    return turns


def chat_body(turns):
    return {"model": "fake-32k", "messages": [{"role": "system", "content": SYSTEM},
                                              *({"role": r, "content": t} for r, t in turns)]}


def responses_body(turns):
    return {"model": "fake-32k", "instructions": SYSTEM, "input": [{"role": r, "content": t} for r, t in turns]}


def messages_body(turns):
    return {"model": "fake-32k", "max_tokens": 256, "system": SYSTEM,
            "messages": [{"role": r, "content": t} for r, t in turns]}


def chat_text(body):
    return body["choices"][0]["message"]["content"]


def responses_text(body):
    return "".join(part.get("text", "") for item in body["output"] if item.get("type") == "message"
                   for part in item.get("content") or ())


def messages_text(body):
    return "".join(block.get("text", "") for block in body["content"] if block.get("type") == "text")


def chat_tools(body):
    return {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}


def named_tools(body):
    return {t.get("name") for t in body.get("tools") or ()}


FORMATS = {
    "chat": ("/chat/completions", "/v1/chat/completions", chat_body, chat_text, chat_tools),
    "responses": ("/responses", "/v1/responses", responses_body, responses_text, named_tools),
    "messages": ("/messages", "/v1/messages", messages_body, messages_text, named_tools),
}


async def post(gw, route: str, body: dict, session: str) -> dict:
    headers = {"Authorization": "Bearer sk-arrival", "x-api-key": "sk-arrival", "anthropic-version": "2023-06-01",
               "X-Session-Id": session}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.base_url + route, json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


def summary_calls(upstream) -> list[dict]:
    return [r for r in upstream.received if r["headers"].get("x-palimpsest-purpose") == "summary"]


def forwarded(upstream, path: str) -> list[dict]:
    return [r for r in upstream.received if r["path"] == path and r.get("json")
            and not r["headers"].get("x-palimpsest-purpose")]


def skipped(gw, reason: str) -> float:
    return gw.app[METRICS].registry.get_sample_value("palimpsest_summary_jobs_skipped_total", {"reason": reason}) or 0


@pytest.mark.parametrize("fmt", list(FORMATS))
async def test_a_one_shot_arrival_pays_no_catch_up_and_a_session_that_goes_on_gets_its_summary(start_gateway, upstream, fmt):
    from tests.support.agent import settle

    route, path, build, text_of, tools_of = FORMATS[fmt]
    gw = await start_gateway(policy={"sync_budget_s": 30})  # time enough to fold: only the cost model says no
    turns = [*pasted_history(), ("user", QUESTION)]
    answer = text_of(await post(gw, route, build(turns), f"arrival-{fmt}"))
    await settle(gw)

    # Answered from the hidden history through the recall tools, every call within the window.
    assert "DEP-58213" in answer
    sent = forwarded(upstream, path)
    assert len(sent) >= 2 and RECALL_NAMES <= tools_of(sent[0]["json"])  # recall rounds, then the answer
    # Tailored: the opening (the planted fact) is no longer a turn of its own; recall, the proactive
    # recall block and the exact values bring the fact back.
    assert len(str(sent[0]["json"])) < len(str(build(turns))) / 2
    # (The puppet refuses a prompt over its window, so every call of the turn fit: `post` got a 200.)
    if fmt == "chat":
        assert all(count_prompt(r["json"]) <= 32_000 for r in sent)
    # The one-shot arrival: no summary call, no checkpoint, and the skip is counted.
    key = gw.app[LEDGER].sessions()[0].key
    assert summary_calls(upstream) == [] and gw.app[CHECKPOINTS].list(key) == []
    assert skipped(gw, "arrival") >= 1

    # The session goes on: its history is the ledger's now, and its summary is written.
    more = [*turns, ("assistant", answer), ("user", "Thanks. What should I check next?")]
    await post(gw, route, build(more), f"arrival-{fmt}")
    await settle(gw)
    assert summary_calls(upstream)
    assert gw.app[CHECKPOINTS].list(key)
