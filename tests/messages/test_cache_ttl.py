"""Anthropic's cache TTLs through the gateway (issue 29): a client that marks its prompt with
``ttl: "1h"`` (as Claude Code does when it caches for an hour) keeps that lifetime on the long
prefix the gateway's own markers stand for, and every request stays valid under Anthropic's
rule that no 1-hour marker comes after a 5-minute one (the simulator answers 400 like the API)."""

from __future__ import annotations

import copy

import pytest

from gateway.messages import adapter as fmt
from simulator.messages_rules import blocks
from tests.messages.test_messages import (BASH, THINKING, blocks_of, client_for, headers, messages_requests,
                                          step_output)
from tests.messages.test_messages_format import body as fixture_body
from tests.support.agent import settle

HOUR = {"type": "ephemeral", "ttl": "1h"}
SHORT = {"type": "ephemeral"}


def ttl(block: dict) -> str | None:
    control = block.get("cache_control")
    return None if not control else control.get("ttl", "5m")


async def ttl_loop(client, session: str, steps: int, *, system_ttl: dict, newest_ttl: dict):
    """A Claude-Code-like Bash loop on fake-32k: its system and its newest tool result marked with
    the given cache_control. Returns every answer."""
    system = [{"type": "text", "text": "You are a coding agent. " * 40},
              {"type": "text", "text": "Work in the repository; be terse.", "cache_control": system_ttl}]
    history = [{"role": "user", "content": [{"type": "text", "text": "Run the chain. [[call Bash {\"command\": \"step 1\"}]]",
                                             "cache_control": newest_ttl}]}]
    answers = []
    for step in range(1, steps + 1):
        message = await client.messages.create(model="fake-32k", max_tokens=2048, system=system, tools=[BASH],
                                               messages=history, thinking=THINKING, extra_headers=headers(session))
        answers.append(message)
        history.append({"role": "assistant", "content": blocks_of(message)})
        call = next(b for b in message.content if b.type == "tool_use")
        for earlier in history[:-1]:
            for block in earlier["content"] if isinstance(earlier["content"], list) else ():
                block.pop("cache_control", None)
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                     "content": step_output(step), "cache_control": newest_ttl}]})
    return answers


def markers(body: dict) -> tuple[list[str], list[str], list[tuple[bool, str]]]:
    """TTLs of the markers on tools, on system and (newest?, ttl) in messages, in order."""
    system = [ttl(b) for b in body.get("system") or () if ttl(b)]
    tools = [ttl(t) for t in body.get("tools") or () if ttl(t)]
    convo = [(i == len(body["messages"]) - 1, ttl(b)) for i, m in enumerate(body["messages"])
             if isinstance(m.get("content"), list) for b in m["content"] if ttl(b)]
    return tools, system, convo


def ordered(body: dict) -> bool:
    order = [t for _, _, t in blocks(body) if t]
    return "5m" not in order or "1h" not in order[order.index("5m"):]


async def test_a_one_hour_client_keeps_its_hour_on_the_long_prefix_and_every_request_is_valid(upstream, start_gateway):
    gw = await start_gateway()
    answers = await ttl_loop(client_for(gw), "ttl-1h", 24, system_ttl=HOUR, newest_ttl=HOUR)
    await settle(gw)
    sent = messages_requests(upstream)
    assert len(answers) == 24 and len(sent) == 24  # none refused
    compacted = 0
    for body, answer in zip(sent, answers):
        assert ordered(body)
        tools, system, convo = markers(body)
        assert system and system[0] == "1h"  # the client's own marker, as it sent it
        assert all(t == "1h" for t in tools + system)  # the summary block stands for its conversation
        newest = [t for is_newest, t in convo if is_newest]
        frontier = [t for is_newest, t in convo if not is_newest]
        assert newest, "the newest message carries a marker"
        if frontier:  # the compacted rounds: an hour; the raw tail behind them: 5 minutes
            compacted += 1
            assert frontier == ["1h"] and newest == ["5m"]
        else:  # nothing stands before it in messages: the client's hour on its whole conversation
            assert newest == ["1h"]
        split = answer.usage.cache_creation
        assert split.ephemeral_1h_input_tokens + split.ephemeral_5m_input_tokens == answer.usage.cache_creation_input_tokens
    assert compacted >= 3
    # Hour-long writes where the gateway rewrote the compacted prefix, 5-minute ones for the tail.
    hour = sum(a.usage.cache_creation.ephemeral_1h_input_tokens for a in answers)
    short = sum(a.usage.cache_creation.ephemeral_5m_input_tokens for a in answers)
    assert hour > 0 and short > 0
    # The metrics bill the client's calls by the same split.
    from gateway.keys import METRICS

    registry = gw.app[METRICS].registry
    billed = {kind: registry.get_sample_value("palimpsest_upstream_billed_tokens_total",
                                              {"model": "fake-32k", "caller": "client", "kind": kind}) or 0
              for kind in ("cache_write", "cache_write_1h")}
    assert billed == {"cache_write": short, "cache_write_1h": hour}


async def test_a_client_mixing_an_hour_on_its_system_and_five_minutes_on_messages(upstream, start_gateway):
    gw = await start_gateway()
    answers = await ttl_loop(client_for(gw), "ttl-mix", 24, system_ttl=HOUR, newest_ttl={"type": "ephemeral", "ttl": "5m"})
    await settle(gw)
    sent = messages_requests(upstream)
    assert len(sent) == len(answers) == 24
    summaries = 0
    for body in sent:
        assert ordered(body)
        tools, system, convo = markers(body)
        assert system[0] == "1h"
        # Its conversation was 5 minutes: the summary block and the compacted rounds stay 5 minutes.
        summaries += len(system) > 1
        assert system[1:] in ([], ["5m"]) and all(t == "5m" for _, t in convo)
    assert summaries > 0


def test_rendered_breakpoints_follow_the_clients_ttls():
    """The renderer alone: a summary block and a compacted result under a client's 1-hour
    markers; the client's own body is left as it was."""
    b = fixture_body()
    for block in b["system"]:
        if "cache_control" in block:
            block["cache_control"] = dict(HOUR)
    b["messages"][-1]["content"][-1]["cache_control"] = dict(HOUR)
    sent = copy.deepcopy(b)
    chat = fmt.parse_messages_request(fmt.orjson.dumps(b))
    view = list(chat.history)
    view[2] = {**view[2], "content": "[placeholder] read it with session_load"}
    out = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "summary"}, *view], None)
    tools, system, convo = markers(out)
    assert system[-1] == "1h" and all(t == "1h" for t in system) and ordered(out)
    assert convo[-1] == (True, "5m" if len(convo) > 1 else "1h")
    assert b == sent


def test_usage_keeps_the_ttl_split_when_summed_and_in_the_chat_shape():
    from gateway.messages.stream import add_usage, chat_usage
    from policies.prices import read_usage

    one = {"input_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 30, "output_tokens": 7,
           "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}}
    two = {**one, "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 0}}
    summed = add_usage(add_usage(None, one), two)  # a recall loop's rounds
    assert summed["cache_creation"] == {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 20}
    assert summed["cache_creation_input_tokens"] == 60
    billed = read_usage(chat_usage(summed))
    assert (billed.uncached, billed.cached, billed.cache_write, billed.cache_write_1h) == (10, 200, 60, 20)
    assert billed == read_usage(summed)


def test_a_request_asks_an_hour_when_a_message_marker_does():
    b = fixture_body()
    assert not fmt.parse_messages_request(fmt.orjson.dumps(b)).long_cache
    b["system"][-1]["cache_control"] = dict(HOUR)  # the system alone: the conversation is 5 minutes
    assert not fmt.parse_messages_request(fmt.orjson.dumps(b)).long_cache
    b["messages"][-1]["content"][-1]["cache_control"] = dict(HOUR)
    assert fmt.parse_messages_request(fmt.orjson.dumps(b)).long_cache


async def test_the_cost_model_prices_a_one_hour_clients_rewrites_at_the_hours_rate(start_gateway):
    from gateway.keys import MESSAGES
    from policies.cost import cost_rates
    from store.records import SessionRef

    gw = await start_gateway()
    views, ref = gw.app[MESSAGES].recorder.views, SessionRef("t", "s")
    assert cost_rates(views.policy_for("claude-sonnet-4-5", ref)).write == 1.25
    assert cost_rates(views.policy_for("claude-sonnet-4-5", ref, True)).write == 2.0


@pytest.mark.parametrize("newest", [SHORT, None])
def test_without_an_hour_the_markers_are_as_before(newest):
    b = fixture_body()
    if newest is None:
        b["messages"][-1]["content"][-1].pop("cache_control", None)
    chat = fmt.parse_messages_request(fmt.orjson.dumps(b))
    out = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "summary"}, *chat.history], None)
    assert all(b.get("cache_control") in (None, SHORT) for b in out["system"])
    assert out["messages"][-1]["content"][-1]["cache_control"] == SHORT
