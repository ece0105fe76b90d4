"""Early compaction events (issue 29): with the cost model, an agent loop's view is compacted
when the interval rule says the rewrite pays (policies/compaction.plan_view, ``_early``), not
only once it passes compact_trigger_ratio, and an event leaves only the newest round raw
(``compact_keep_rounds`` 1 in balanced). On every wire format the upstream receives smaller
views, compacted results never come back raw, and the live round is always raw; on Messages
the end of the compacted rounds carries a cache breakpoint, so an event reads them back."""

from __future__ import annotations

import openai
import orjson

from simulator.messages_rules import MIN_CACHEABLE, blocks
from simulator.workloads import agent_loop_session
from tests.messages.test_messages import client_for, run_loop
from tests.support.agent import drive_loop, drive_responses_loop, settle

MARK = "[Tool result compacted by the gateway]"
OFF = {"cost_model": False, "compact_keep_rounds": 2}  # the trigger alone, two raw rounds: as before


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or () if isinstance(b, dict))


def results(path: str, body: dict) -> list[tuple[str, str]]:
    """(call id, text) of every tool result a view carries, in order."""
    if path.endswith("/chat/completions"):
        return [(m["tool_call_id"], _text(m.get("content"))) for m in body["messages"] if m.get("role") == "tool"]
    if path.endswith("/responses"):
        return [(i["call_id"], _text(i.get("output"))) for i in body["input"] if i.get("type") == "function_call_output"]
    return [(b["tool_use_id"], _text(b.get("content"))) for m in body["messages"] if isinstance(m.get("content"), list)
            for b in m["content"] if b.get("type") == "tool_result"]


def views(upstream, path: str) -> list[dict]:
    return [r["json"] for r in upstream.received if r["path"] == path and r.get("json")
            and not r["headers"].get("x-palimpsest-purpose")]


def check(upstream, path: str) -> tuple[int, int]:
    """Asserts what holds on every run; returns (views with a newly compacted result, the
    largest view after the first compaction, in bytes)."""
    sent = views(upstream, path)
    compacted: set[str] = set()
    events, largest = 0, 0
    for body in sent:
        found = results(path, body)
        if not found:
            continue
        assert MARK not in found[-1][1], "the live round is always raw"
        now = {cid for cid, text in found if MARK in text}
        assert compacted <= now, "a compacted result came back raw"
        events += bool(now - compacted)
        compacted |= now
        if compacted:
            largest = max(largest, len(orjson.dumps(body)))
    assert compacted
    return events, largest


async def _chat(start_gateway, policy: dict | None):
    gw = await start_gateway(policy=policy or {})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-e", max_retries=0, default_headers={"X-Session-Id": "early"})
    await drive_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()
    await settle(gw)
    return gw


async def test_chat_loop_compacts_early_and_stays_small(start_gateway, upstream):
    await _chat(start_gateway, OFF)
    before = check(upstream, "/v1/chat/completions")
    upstream.received.clear()
    await _chat(start_gateway, None)
    after = check(upstream, "/v1/chat/completions")
    assert after[0] > before[0]  # more, smaller events
    assert after[1] < 0.7 * before[1]  # the view stays far smaller


async def _responses(start_gateway, policy: dict | None):
    gw = await start_gateway(policy=policy or {})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-e", max_retries=0, default_headers={"X-Session-Id": "early-r"})
    _, answered = await drive_responses_loop(api, agent_loop_session(seed=13, turns=1, calls=40), model="fake-32k")
    await api.close()
    await settle(gw)
    assert len(answered) == 41
    return gw


async def test_responses_loop_compacts_early_and_stays_small(start_gateway, upstream):
    await _responses(start_gateway, OFF)
    before = check(upstream, "/v1/responses")
    upstream.received.clear()
    await _responses(start_gateway, None)
    after = check(upstream, "/v1/responses")
    assert after[0] > before[0]
    assert after[1] < 0.7 * before[1]


async def test_messages_loop_compacts_early_and_reads_the_compacted_rounds_back(start_gateway, upstream):
    gw = await start_gateway(policy=OFF)
    await run_loop(client_for(gw), "early-m-off", 30)
    await settle(gw)
    before = check(upstream, "/v1/messages")
    upstream.received.clear()
    gw = await start_gateway()
    _, answers = await run_loop(client_for(gw), "early-m", 30)
    await settle(gw)
    after = check(upstream, "/v1/messages")
    assert after[0] > before[0]
    assert after[1] < 0.8 * before[1]
    # The end of the compacted rounds carries a breakpoint (at most 4 in all), so the request
    # that compacts more reads the earlier compacted rounds from the cache, not just tools and system.
    sent = views(upstream, "/v1/messages")
    assert len(sent) == len(answers)
    compacted: set[str] = set()
    reads_past_system = events = 0
    previous = None
    for body, answer in zip(sent, answers):
        found = results("/v1/messages", body)
        now = {cid for cid, text in found if MARK in text}
        marked = [b for m in body["messages"] if isinstance(m.get("content"), list) for b in m["content"]
                  if b.get("cache_control")]
        if now:
            last = next(b for m in reversed(body["messages"]) if isinstance(m.get("content"), list)
                        for b in reversed(m["content"]) if b.get("type") == "tool_result" and MARK in _text(b.get("content")))
            assert last.get("cache_control"), "the last compacted result ends a cached prefix"
        assert sum(map(bool, (t for _, _, t in blocks(body)))) <= 4 and len(marked) <= 3
        # An event that brings a new summary block rewrites from the system on (that is priced).
        same_head = previous is not None and (previous.get("system"), previous.get("tools")) == (body.get("system"), body.get("tools"))
        previous = body
        if compacted and now - compacted and same_head and _cacheable(body, compacted):
            events += 1
            head = sum(t for key, t, _ in blocks(body) if key.startswith((b"tool:", b"system:")))
            reads_past_system += answer.usage.cache_read_input_tokens > head
        compacted |= now
    assert events >= 3 and reads_past_system == events


def _cacheable(body: dict, compacted: set[str]) -> bool:
    """Does the prefix up to the last result compacted before this request reach Anthropic's
    minimum cacheable prefix? Under it the previous request's breakpoint there wrote nothing,
    so an event (early ones come while the compacted rounds are small) has nothing past the
    system to read."""
    cum = end = 0
    for key, tokens, _ in blocks(body):
        cum += tokens
        if b'"type":"tool_result"' in key and any(f'"tool_use_id":"{cid}"'.encode() in key for cid in compacted):
            end = cum
    return end >= MIN_CACHEABLE
