"""The Messages adapter on what Claude Code sends (tests/fixtures/wire/claude-tool-round.json,
2.1.197's; claude-2.1.332-tool-round.json, 2.1.332's):
parsing into the neutral model, identity, rendering back, regrouping and cache breakpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import orjson
import pytest

from gateway.messages import adapter as fmt
from gateway.messages.cache_breakpoints import count_breakpoints
from gateway.http.errors import BadRequest
from policies.rounds import split_rounds, tool_pair_problems
from store.canonical import path_ids

FIXTURE_DIR = Path(__file__).parents[1] / "fixtures/wire"
FIXTURE = json.loads((FIXTURE_DIR / "claude-tool-round.json").read_text())


def body() -> dict:
    return copy.deepcopy(FIXTURE["body"])


def parse(b: dict):
    return fmt.parse_messages_request(orjson.dumps(b))


def test_claude_code_round_parses_into_neutral_items():
    chat = parse(body())
    assert chat.format == "messages" and chat.stream is True and chat.max_output_tokens == 4096
    roles = [m["role"] for m in chat.history]
    assert roles == ["user", "assistant", "tool"]
    assistant = chat.history[1]
    assert assistant["tool_calls"][0]["function"] == {"name": "Bash", "arguments": '{"command":"echo hello-from-bash","description":"echo"}'}
    assert assistant["opaque"] == [{"type": "thinking", "thinking": "I will run it.", "signature": "sig-abc"}]
    assert chat.history[2] == {**chat.history[2], "tool_call_id": "toolu_2", "content": "hello-from-bash"}
    # The top-level system and the mid-conversation system message count as instructions.
    assert chat.instructions[0]["content"].startswith("x-anthropic-billing-header")
    assert chat.instructions[1]["content"].startswith("Available agent types")
    assert not tool_pair_problems(chat.history)
    assert split_rounds(chat.history) == [(0, 3)]  # the task, the call and its result: one round


def test_an_unchanged_view_renders_the_clients_messages_exactly():
    b = body()
    chat = parse(b)
    out = fmt.render_body(chat, [*chat.instructions, *chat.history], None)
    assert out["messages"] == b["messages"]  # the mid-conversation system message in its place
    assert out["system"] == b["system"] and out["tools"] == b["tools"]
    assert count_breakpoints(out) <= 4


def test_claude_code_2_1_332s_round_renders_back_exactly():
    """tests/fixtures/wire/claude-2.1.332-tool-round.json: its system turn (sent with no beta
    header) and its thinking block with the empty text of display "omitted" come back in place."""
    b = json.loads((FIXTURE_DIR / "claude-2.1.332-tool-round.json").read_text())["body"]
    chat = parse(copy.deepcopy(b))
    assert [m["role"] for m in chat.history] == ["user", "assistant", "tool"]
    assert chat.history[1]["opaque"] == [{"type": "thinking", "thinking": "", "signature": "sig-abc"}]
    assert any(i["content"].startswith("# Environment") for i in chat.instructions)
    out = fmt.render_body(chat, [*chat.instructions, *chat.history], None)
    assert out["messages"] == b["messages"] and out["system"] == b["system"] and out["tools"] == b["tools"]
    assert out["thinking"] == {"type": "adaptive", "display": "omitted"}


def test_cache_control_markers_are_not_identity():
    moved = body()
    for message in moved["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            block.pop("cache_control", None)
    moved["messages"][0]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    assert path_ids(parse(moved).history) == path_ids(parse(body()).history)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    a, b_ = body(), body()
    a["messages"][0]["content"].append(dict(image))
    b_["messages"][0]["content"].append({**image, "cache_control": {"type": "ephemeral"}})
    assert path_ids(parse(a).history) == path_ids(parse(b_).history)


def test_thinking_signature_is_identity():
    edited = body()
    edited["messages"][2]["content"][0]["signature"] = "sig-other"
    assert path_ids(parse(edited).history)[1] != path_ids(parse(body()).history)[1]


def test_a_compacted_result_and_the_next_user_text_regroup_into_one_user_message():
    b = body()
    b["messages"][3]["content"].append({"type": "text", "text": "and now this"})
    chat = parse(b)
    assert [m["role"] for m in chat.history] == ["user", "assistant", "tool", "user"]
    view = list(chat.history)
    view[2] = {**view[2], "content": "[placeholder] read it with session_load"}
    out = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "<session_summary>x</session_summary>"}, *view], None)
    last = out["messages"][-1]
    assert last["role"] == "user" and [blk["type"] for blk in last["content"]] == ["tool_result", "text"]
    assert last["content"][0]["content"] == "[placeholder] read it with session_load"
    assert last["content"][0]["tool_use_id"] == "toolu_2"
    # The thinking block went as the client sent it, bound to its tool_use.
    assert out["messages"][2] == b["messages"][2]
    # The summary block is a system block after the client's own, with a breakpoint.
    assert out["system"][: len(b["system"])] == b["system"]
    assert out["system"][-1]["text"].startswith("<session_summary>") and "cache_control" in out["system"][-1]
    assert count_breakpoints(out) <= 4
    assert "cache_control" in last["content"][-1]  # the newest message carries one


def test_breakpoints_stay_within_four_when_the_client_marks_tools_and_system():
    b = body()
    for tool in b["tools"][-3:]:
        tool["cache_control"] = {"type": "ephemeral"}
    chat = parse(b)
    out = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "summary"}, *chat.history], None)
    assert count_breakpoints(out) == 4
    assert "cache_control" in out["system"][-1] and "cache_control" in out["messages"][-1]["content"][-1]
    assert count_breakpoints(b) == 6  # the client's own body is untouched


def test_recall_calls_and_results_render_as_tool_use_and_tool_result():
    chat = parse(body())
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_r1", "type": "function", "function": {"name": "session_search", "arguments": '{"query": "x"}'}}]}
    result = {"role": "tool", "tool_call_id": "toolu_r1", "content": "found"}
    out = fmt.render_body(chat, [*chat.history, call, result], None)
    assert out["messages"][-2] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_r1", "name": "session_search", "input": {"query": "x"}}]}
    assert out["messages"][-1]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_r1", "content": "found",
                                                 "cache_control": {"type": "ephemeral"}}


def test_the_view_starts_at_the_newest_provider_compaction_block():
    b = body()
    b["messages"] = [
        {"role": "user", "content": "old task"},
        {"role": "assistant", "content": [{"type": "compaction", "content": "summary one"}]},
        {"role": "user", "content": "middle"},
        {"role": "assistant", "content": [{"type": "compaction", "content": "summary two"}, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "newest"},
    ]
    chat = parse(b)
    assert [m.get("content") for m in chat.history] == ["middle", "ok", "newest"]  # opens with a user turn
    assert chat.history[1]["opaque"] == [{"type": "compaction", "content": "summary two"}]
    out = fmt.render_body(chat, [*chat.instructions, *chat.history], None)
    assert out["messages"][:2] == b["messages"][2:4]
    assert out["messages"][2]["content"][0]["text"] == "newest"  # with the gateway's breakpoint


@pytest.mark.parametrize("broken", [
    {"messages": []},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "user", "content": 3}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
    {"system": 5},
    {"stream": "yes"},
    {"model": ""},
])
def test_malformed_bodies_are_400(broken):
    b = {**body(), **broken}
    with pytest.raises(BadRequest):
        parse(b)


def test_a_gateway_block_inside_the_conversation_joins_the_next_user_message():
    chat = parse(body())
    view = [*chat.instructions, *chat.history[:2], chat.history[2],
            {"role": "system", "content": "<recalled>old facts</recalled>"}, {"role": "user", "content": "next question"}]
    out = fmt.render_body(chat, view, None)
    assert out["system"] == FIXTURE["body"]["system"]  # the client's system prefix is untouched
    last = out["messages"][-1]
    assert [b["type"] for b in last["content"]] == ["tool_result", "text", "text"]
    assert last["content"][1]["text"] == "<recalled>old facts</recalled>"


def test_without_a_client_system_the_tools_end_their_own_breakpoint():
    b = body()
    del b["system"]
    chat = parse(b)
    out = fmt.render_body(chat, [{"role": "system", "content": "summary"}, *chat.history], None)
    assert "cache_control" in out["tools"][-1] and "cache_control" in out["system"][-1]
    assert count_breakpoints(out) == 3 and "cache_control" not in b["tools"][-1]


from hypothesis import given, settings, strategies as st  # noqa: E402

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=8),
                 st.lists(st.integers(-2, 2), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2))
BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(max_size=30), JUNK)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.sampled_from(["t1", "t2"]), "name": st.sampled_from(["Bash", "session_search"]),
                           "input": JUNK}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.one_of(st.sampled_from(["t1", "t2"]), JUNK)},
                          optional={"content": st.one_of(st.text(max_size=20), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": JUNK}), max_size=2), JUNK),
                                    "is_error": JUNK, "cache_control": JUNK}),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "redacted_thinking", "compaction", "image", "x"])},
                          optional={"thinking": JUNK, "signature": JUNK, "data": JUNK, "content": JUNK, "cache_control": JUNK}),
    JUNK,
)
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "system"]), JUNK)},
                                optional={"content": st.one_of(st.text(max_size=20), st.lists(BLOCK, max_size=4), JUNK)})
BODY = st.fixed_dictionaries({"model": st.one_of(st.just("fake-32k"), JUNK), "messages": st.one_of(st.lists(MESSAGE, max_size=6), JUNK)},
                             optional={"system": st.one_of(st.text(max_size=10), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=5)}), max_size=2), JUNK),
                                       "stream": JUNK, "max_tokens": JUNK, "tools": JUNK})


@settings(max_examples=400, deadline=None)
@given(BODY)
def test_any_body_parses_to_a_request_or_a_400_and_renders(b):
    try:
        chat = parse(b)
    except BadRequest:
        return
    ids = path_ids(chat.history)
    assert len(ids) == len(chat.history)
    out = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "summary"}, *chat.history], None)
    orjson.dumps(out)
    assert count_breakpoints(out) <= max(4, count_breakpoints(b) if isinstance(b.get("tools"), list) else 4)
