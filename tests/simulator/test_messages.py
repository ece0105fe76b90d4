"""/v1/messages on the simulated provider: strict like Anthropic's, parsed by the anthropic SDK.

Driven with the official SDK (JSON and streams) and, where the bytes matter, raw aiohttp."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import anthropic
import pytest

from simulator.puppet import PUPPET_STATE

BASH = {"name": "Bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
SEARCH = {"name": "session_search", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
LOAD = {"name": "session_load", "input_schema": {"type": "object", "properties": {"event_id": {"type": "string"}}}}
THINK = {"type": "adaptive"}
HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire"


@pytest.fixture
async def client(puppet):
    async with anthropic.AsyncAnthropic(base_url=puppet[1].removesuffix("/v1"), api_key="sk-ant",
                                        max_retries=0) as sdk:
        yield sdk


def user(text):
    return {"role": "user", "content": text}


def dumped(content) -> list[dict]:
    return [block.model_dump(exclude_none=True, exclude={"parsed_output"}) for block in content]


async def tool_round(client, thinking=THINK) -> tuple[list[dict], dict]:
    messages = [user('check [[call Bash {"command": "ls -la"}]]')]
    extra = {"thinking": thinking} if thinking else {}
    first = await client.messages.create(model="fake-32k", max_tokens=1024, messages=messages,
                                         tools=[BASH], **extra)
    content = dumped(first.content)
    use = content[-1]
    messages += [{"role": "assistant", "content": content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                               "content": "a.txt b.txt"}]}]
    return messages, use


async def post(http, puppet, body, headers=HEADERS, path="/messages"):
    async with http.post(puppet[1] + path, json=body, headers=headers) as raw:
        return raw.status, await raw.json()


async def test_text_answer_and_usage(client):
    message = await client.messages.create(model="fake-32k", max_tokens=100, messages=[user("hello")])
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].text == "ok: hello" and message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_input_tokens == message.usage.cache_creation_input_tokens == 0


async def test_with_thinking_a_signed_thinking_block_precedes_tool_use_and_the_round_completes(client):
    messages, use = await tool_round(client)
    assert [b["type"] for b in messages[1]["content"]] == ["thinking", "tool_use"]
    assert messages[1]["content"][0]["signature"]
    assert use["name"] == "Bash" and use["input"] == {"command": "ls -la"}
    async with client.messages.stream(model="fake-32k", max_tokens=1024, messages=messages,
                                      tools=[BASH], thinking=THINK) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text == "Tool Bash returned: a.txt b.txt"


async def test_without_thinking_there_is_no_thinking_block(client):
    messages, _ = await tool_round(client, thinking=None)
    assert [b["type"] for b in messages[1]["content"]] == ["tool_use"]
    follow = await client.messages.create(model="fake-32k", max_tokens=100, messages=messages, tools=[BASH])
    assert follow.content[0].text.startswith("Tool Bash returned")


async def test_stream_events_are_named_and_the_sdk_rebuilds_the_message(puppet, http, client):
    body = {"model": "fake-32k", "max_tokens": 1024, "stream": True, "thinking": THINK, "tools": [BASH],
            "messages": [user('go [[call Bash {"command": "echo a long command line"}]]')]}
    async with http.post(puppet[1] + "/messages", json=body, headers=HEADERS) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        text = await raw.text()
    events = []
    for block in text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        events.append(data)
    names = [e["type"] for e in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    deltas = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert {"thinking_delta", "signature_delta", "input_json_delta"} <= set(deltas)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    partial = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert json.loads(partial) == {"command": "echo a long command line"}

    body.pop("stream")
    async with client.messages.stream(**body) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == {"command": "echo a long command line"}


@pytest.mark.parametrize("change, status, message", [
    (lambda b, h: h.pop("anthropic-version"), 400, "anthropic-version: header is required"),
    (lambda b, h: b.pop("max_tokens"), 400, "max_tokens: Field required"),
    (lambda b, h: b.pop("model"), 400, "model: Field required"),
    (lambda b, h: b.update(messages=[{"role": "assistant", "content": "hi"}]), 400, 'first message must use the "user" role'),
    (lambda b, h: b.update(messages=[user("a"), user("b")]), 400, 'found multiple "user" roles in a row'),
    (lambda b, h: b.update(messages=[user("a"), {"role": "tool", "content": "note"}]), 400,
     "messages.1.role: Input should be 'user' or 'assistant'"),
    (lambda b, h: b.update(system=[{"type": "image"}]), 400, "system:"),
    (lambda b, h: b.update(thinking={"type": "enabled", "budget_tokens": 500}), 400, "budget_tokens"),
    (lambda b, h: b.update(model="claude-nonexistent"), 404, "model: claude-nonexistent"),
])
async def test_malformed_requests_get_anthropic_errors(puppet, http, change, status, message):
    body, headers = {"model": "fake-32k", "max_tokens": 64, "messages": [user("hi")]}, dict(HEADERS)
    change(body, headers)
    got_status, error = await post(http, puppet, body, headers)
    assert got_status == status and error["type"] == "error"
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert message in error["error"]["message"]


async def test_mid_conversation_system_messages_are_accepted_with_or_without_their_old_beta(puppet, http):
    """Generally available: Claude Code 2.1.332 sends system turns with no beta header (its bundle:
    "'mid-conversation-system-2026-04-07' is generally available; the header is not sent"), and
    takes a 400 "Input should be 'user' or 'assistant'" as a provider without them, falling back to
    folding them into the user turn. Older releases still send the beta. Other roles stay refused."""
    body = {"model": "fake-32k", "max_tokens": 64,
            "messages": [user("a"), {"role": "system", "content": "agents: none"}, {"role": "assistant", "content": "b"}, user("c")]}
    for headers in (HEADERS, {**HEADERS, "anthropic-beta": "mid-conversation-system-2026-04-07"}):
        status, message = await post(http, puppet, body, headers)
        assert status == 200 and message["content"][0]["text"] == "ok: c"
    body["messages"][1]["role"] = "developer"
    status, error = await post(http, puppet, body)
    assert status == 400 and "messages.1.role: Input should be 'user' or 'assistant'" in error["error"]["message"]


async def test_every_tool_use_needs_its_result_first_in_the_next_user_message(client):
    messages, use = await tool_round(client)
    missing = messages[:2] + [user("forget it")]
    late = messages[:2] + [{"role": "user", "content": [{"type": "text", "text": "here"}, messages[2]["content"][0]]}]
    stray = [user("hi"), {"role": "assistant", "content": "ok"},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}]
    expected = [f"messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: {use['id']}.",
                "`tool_result` blocks must come first",
                "unexpected `tool_use_id` found in `tool_result` blocks: toolu_x."]
    for body, message in zip((missing, late, stray), expected):
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model="fake-32k", max_tokens=1024, messages=body, tools=[BASH], thinking=THINK)
        assert message in caught.value.body["error"]["message"]


async def test_thinking_signatures_must_verify_and_lead_the_tool_turn(client):
    messages, _ = await tool_round(client)
    thinking, use = messages[1]["content"]
    for forged in ({**thinking, "thinking": thinking["thinking"] + " (edited)"},
                   {**thinking, "signature": "sig-made-up"}):
        body = [messages[0], {"role": "assistant", "content": [forged, use]}, messages[2]]
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model="fake-32k", max_tokens=1024, messages=body, tools=[BASH], thinking=THINK)
        assert caught.value.body["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
    dropped = [messages[0], {"role": "assistant", "content": [use]}, messages[2]]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=1024, messages=dropped, tools=[BASH], thinking=THINK)
    assert "Expected `thinking` or `redacted_thinking`, but found `tool_use`" in caught.value.body["error"]["message"]
    # Without thinking on, the same replay is fine.
    ok = await client.messages.create(model="fake-32k", max_tokens=1024, messages=dropped, tools=[BASH])
    assert ok.content[0].text.startswith("Tool Bash returned")


async def test_an_omitted_thinking_display_sends_an_empty_text_whose_signature_still_binds(client, puppet, http):
    """``thinking.display`` "omitted" (Claude Code 2.1.332): the thinking block comes back with an
    empty text and a signature, streamed with no thinking_delta; sent back as it came it is
    accepted, with a text of the client's own put in it refused."""
    omitted = {"type": "adaptive", "display": "omitted"}
    messages, _ = await tool_round(client, thinking=omitted)
    thinking, use = messages[1]["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "" and thinking["signature"]
    ok = await client.messages.create(model="fake-32k", max_tokens=1024, messages=messages, tools=[BASH], thinking=omitted)
    assert ok.content[0].text.startswith("Tool Bash returned")
    filled = [messages[0], {"role": "assistant", "content": [{**thinking, "thinking": "I list the files."}, use]}, messages[2]]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=1024, messages=filled, tools=[BASH], thinking=omitted)
    assert caught.value.body["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
    body = {"model": "fake-32k", "max_tokens": 1024, "messages": messages[:1], "tools": [BASH],
            "thinking": omitted, "stream": True}
    async with http.post(puppet[1] + "/messages", json=body, headers=HEADERS) as raw:
        text = await raw.text()
    assert raw.status == 200 and "signature_delta" in text and "thinking_delta" not in text


async def test_at_most_four_cache_breakpoints(client):
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": f"part {i}", "cache_control": mark} for i in range(4)]
    ok = await client.messages.create(model="fake-32k", max_tokens=64, system=system, messages=[user("hi")])
    assert ok.content[0].text == "ok: hi"
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, system=system, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": mark}]}])
    assert caught.value.body["error"]["message"] == "A maximum of 4 blocks with cache_control may be provided. Found 5."


async def test_markers_inside_tool_results_count_and_cache_like_top_level_ones(client):
    mark, hour = {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}
    messages, use = await tool_round(client, thinking=None)
    nested = [{"type": "text", "text": "a.txt b.txt " + "line " * 1500, "cache_control": mark}]
    messages[-1] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": nested}]}
    # The only breakpoint is inside the tool result: the prefix through it is written.
    one = await client.messages.create(model="fake-32k", max_tokens=64, messages=messages, tools=[BASH])
    total = (await client.messages.count_tokens(model="fake-32k", messages=messages, tools=[BASH])).input_tokens
    assert one.usage.cache_creation_input_tokens == total and one.usage.cache_creation.ephemeral_5m_input_tokens == total
    # It counts toward the four...
    system = [{"type": "text", "text": f"part {i}", "cache_control": mark} for i in range(4)]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, system=system, messages=messages, tools=[BASH])
    assert caught.value.body["error"]["message"] == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    # ...and to the TTL order: a 1-hour marker after it is refused.
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                 {"role": "user", "content": [{"type": "text", "text": "next", "cache_control": hour}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, messages=messages, tools=[BASH])
    assert caught.value.body["error"]["message"].startswith("messages.4.content.0.cache_control.ttl: a ttl='1h'")


async def test_over_the_window_is_prompt_too_long_and_count_tokens_agrees(client):
    messages = [user("word " * 400)]
    counted = await client.messages.count_tokens(model="tiny", messages=messages)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="tiny", max_tokens=10, messages=messages)
    assert caught.value.body["error"]["message"] == f"prompt is too long: {counted.input_tokens} tokens > 300 maximum"


async def test_cache_usage_follows_breakpoints(client):
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are careful. " + "rule " * 1500, "cache_control": mark}]
    first_turn = [{"role": "user", "content": [{"type": "text", "text": "first", "cache_control": mark}]}]
    one = await client.messages.create(model="fake-128k", max_tokens=64, system=system, messages=first_turn)
    total_one = (await client.messages.count_tokens(model="fake-128k", system=system, messages=first_turn)).input_tokens
    assert one.usage.cache_read_input_tokens == 0
    assert one.usage.cache_creation_input_tokens == total_one and one.usage.input_tokens == 0

    # The next turn moves the message breakpoint: the old prefix is read, only the new part written.
    second_turn = [{"role": "user", "content": "first"}, {"role": "assistant", "content": one.content[0].text},
                   {"role": "user", "content": [{"type": "text", "text": "second", "cache_control": mark}]}]
    two = await client.messages.create(model="fake-128k", max_tokens=64, system=system, messages=second_turn)
    total_two = (await client.messages.count_tokens(model="fake-128k", system=system, messages=second_turn)).input_tokens
    assert two.usage.cache_read_input_tokens == total_one
    assert two.usage.cache_creation_input_tokens == total_two - total_one
    assert two.usage.input_tokens == 0

    # A changed system prompt misses every entry; without breakpoints nothing is written.
    other = [{"type": "text", "text": "You are bold. " + "rule " * 1500}]
    three = await client.messages.create(model="fake-128k", max_tokens=64, system=other, messages=[user("first")])
    assert three.usage.cache_read_input_tokens == three.usage.cache_creation_input_tokens == 0
    assert three.usage.input_tokens > 1500


async def test_ttls_are_kept_split_in_usage_and_ordered_like_anthropic(client, puppet):
    hour, short = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral", "ttl": "5m"}
    system = [{"type": "text", "text": "You are careful. " + "rule " * 1500, "cache_control": hour}]
    turn = [{"role": "user", "content": [{"type": "text", "text": "first " + "word " * 1200, "cache_control": short}]}]
    # The system prompt's tokens: counted with a one-token message (its role adds 3).
    head = (await client.messages.count_tokens(model="fake-128k", system=system, messages=[user("x")])).input_tokens - 4
    total = (await client.messages.count_tokens(model="fake-128k", system=system, messages=turn)).input_tokens
    one = await client.messages.create(model="fake-128k", max_tokens=64, system=system, messages=turn)
    split = one.usage.cache_creation
    # Written up to the last 1-hour breakpoint at 1h, from there to the last breakpoint at 5m.
    assert one.usage.cache_creation_input_tokens == total
    assert split.ephemeral_1h_input_tokens == head and split.ephemeral_5m_input_tokens == total - head

    # Ten minutes later the 5-minute entry is gone, the 1-hour one is read (and nothing of it rewritten).
    state = puppet[0][PUPPET_STATE]
    start = state.clock()
    state.clock = lambda: start + 600
    two = await client.messages.create(model="fake-128k", max_tokens=64, system=system, messages=turn)
    assert two.usage.cache_read_input_tokens == head
    assert two.usage.cache_creation.ephemeral_1h_input_tokens == 0
    assert two.usage.cache_creation.ephemeral_5m_input_tokens == total - head
    # Two hours later nothing is left.
    state.clock = lambda: start + 600 + 7200
    three = await client.messages.create(model="fake-128k", max_tokens=64, system=system, messages=turn)
    assert three.usage.cache_read_input_tokens == 0

    # A 1-hour breakpoint after a 5-minute one (tools, system, messages) and an unknown ttl: 400.
    wrong = [{"type": "text", "text": "rules", "cache_control": short}]
    later = [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": hour}]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, system=wrong, messages=later)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"].startswith(
        "messages.0.content.0.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m'")
    tool = {**BASH, "cache_control": {"type": "ephemeral"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, tools=[tool], system=system, messages=[user("hi")])
    assert caught.value.body["error"]["message"].startswith("system.0.cache_control.ttl: a ttl='1h'")
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}])
    assert "Input should be '5m' or '1h'" in caught.value.body["error"]["message"]


async def test_overloaded_and_injected_failures_use_anthropic_statuses(client, puppet):
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, messages=[user("now [[fail 529]]")])
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"
    puppet[0][PUPPET_STATE].failures.append(429)
    with pytest.raises(anthropic.RateLimitError) as caught:
        await client.messages.create(model="fake-32k", max_tokens=64, messages=[user("fine")])
    assert caught.value.body["error"]["type"] == "rate_limit_error"


async def test_recall_tools_are_called_like_on_the_chat_route(client):
    ask = [user("RECALL: what is the deploy id?")]
    first = await client.messages.create(model="fake-32k", max_tokens=256, messages=ask, tools=[BASH, SEARCH, LOAD])
    search = first.content[0]
    assert search.name == "session_search" and search.input == {"query": "what is the deploy id?"}
    results = json.dumps({"results": [{"event_id": "ev_7", "snippet": "deploy"}]})
    ask += [{"role": "assistant", "content": dumped(first.content)},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": search.id, "content": results}]}]
    second = await client.messages.create(model="fake-32k", max_tokens=256, messages=ask, tools=[BASH, SEARCH, LOAD])
    assert second.content[0].name == "session_load" and second.content[0].input == {"event_id": "ev_7"}


async def test_summary_calls_are_answered_with_the_requested_headings(client):
    message = await client.messages.create(
        model="fake-32k", max_tokens=1024, system="Summarise.\n## Goal\n## Next step",
        messages=[user("user: Goal is to migrate billing. Next we run the dry-run.")],
        extra_headers={"x-palimpsest-purpose": "summary"})
    headings = [line for line in message.content[0].text.splitlines() if line.startswith("## ")]
    assert headings == ["## Goal", "## Next step"]


@pytest.mark.parametrize("fixture", ["claude-tool-round.json", "claude-2.1.332-tool-round.json"])
async def test_the_request_claude_code_really_sends_is_accepted_and_its_fake_signature_refused(puppet, http, fixture):
    """2.1.197's and 2.1.332's (its system turn without a beta header, its thinking display
    "omitted"): the recorders replaced the signatures with "sig-abc"."""
    recorded = json.loads((FIXTURES / fixture).read_text())
    headers = {**HEADERS, "anthropic-beta": recorded["headers"]["anthropic-beta"]}
    body = copy.deepcopy(recorded["body"])
    body["messages"] = body["messages"][:2]  # the prompt and Claude Code's mid-conversation system message
    async with http.post(puppet[1] + "/messages", json=body, headers=headers) as raw:
        text = await raw.text()
    assert raw.status == 200, text
    assert '"name":"Bash"' in text and "signature_delta" in text
    # The recorder signed its thinking block "sig-abc": a real provider refuses that.
    status, error = await post(http, puppet, recorded["body"], headers)
    assert status == 400 and "Invalid `signature` in `thinking` block" in error["error"]["message"]
