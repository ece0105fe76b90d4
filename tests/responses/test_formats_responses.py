"""The Responses adapter on what Codex CLI really sends (tests/fixtures/wire/codex-tool-round.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import orjson
import pytest

from gateway.responses import adapter as fmt
from gateway.http.errors import BadRequest
from policies import split_rounds, tool_pair_problems
from policies.messages import with_text
from store.canonical import path_ids

FIXTURE = Path(__file__).parents[1] / "fixtures" / "wire" / "codex-tool-round.json"


def codex_body() -> dict:
    return json.loads(FIXTURE.read_text())["body"]


def parse(body: dict):
    return fmt.parse_responses_request(orjson.dumps(body))


def test_codex_input_maps_onto_neutral_items():
    chat = parse(codex_body())
    assert [m["role"] for m in chat.instructions] == ["system", "system"]  # two developer messages
    roles = [m["role"] for m in chat.history]
    assert roles == ["user", "user", "assistant", "tool"]
    assistant = chat.history[2]
    assert assistant["tool_calls"] == [{"id": "call_2", "type": "function", "function": {
        "name": "exec_command", "arguments": '{"cmd": "echo hello-from-tool"}'}}]
    # The reasoning item is part of the assistant item that makes the call: never apart from it.
    assert [i["type"] for i in assistant["wire"]["items"]] == ["reasoning", "function_call"]
    assert assistant["opaque"] == [{"type": "reasoning", "summary": [], "encrypted_content": "opaque"}]
    assert chat.history[3]["tool_call_id"] == "call_2"
    assert tool_pair_problems(chat.history) == []
    assert split_rounds(chat.history) == [(0, 1), (1, 4)]  # the call and its output: one round


def test_an_unchanged_view_renders_the_clients_items_exactly():
    body = codex_body()
    chat = parse(body)
    rendered = fmt.render_body(chat, [*chat.instructions, *chat.history], chat.body.get("tools"))
    assert orjson.dumps(rendered["input"]) == orjson.dumps(body["input"])
    assert rendered["tools"] == body["tools"] and "instructions" not in rendered


def test_a_placeholder_changes_only_the_output_of_its_item():
    body = codex_body()
    chat = parse(body)
    tool = chat.history[3]
    view = [*chat.instructions, *chat.history[:3], with_text(tool, "[compacted]")]
    items = fmt.render_body(chat, view, None)["input"]
    assert items[:-1] == body["input"][:-1]  # reasoning and call byte-identical
    assert items[-1] == {**body["input"][-1], "output": "[compacted]"}


def test_identity_ignores_what_the_provider_assigns_but_not_reasoning():
    body = codex_body()
    ids = path_ids(parse(body).history)
    resent = copy.deepcopy(body)
    for item in resent["input"]:
        item.pop("id", None)
        item.pop("status", None)
    assert path_ids(parse(resent).history) == ids  # ids and status are not what an item is
    other = copy.deepcopy(body)
    next(i for i in other["input"] if i["type"] == "reasoning")["encrypted_content"] = "different"
    assert path_ids(parse(other).history)[2] != ids[2]  # two different reasoning items are two events


def test_the_same_conversation_in_chat_and_responses_is_one_path():
    chat_history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "next"}]
    body = {"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
        {"type": "message", "role": "user", "content": "next"}]}
    assert path_ids(parse(body).history) == path_ids(chat_history)


def test_string_input_is_one_user_message():
    chat = parse({"model": "m", "input": "hello", "instructions": "be brief"})
    assert chat.history == [{"role": "user", "content": "hello",
                             "wire": {"format": "responses", "items": [{"type": "message", "role": "user", "content": "hello"}]}}]
    assert chat.instructions[0]["content"] == "be brief"
    rendered = fmt.render_body(chat, [*chat.instructions, {"role": "system", "content": "SUMMARY"}, *chat.history], None)
    assert rendered["instructions"] == "be brief"  # stays in its own field, byte-identical
    assert rendered["input"][0] == {"type": "message", "role": "developer",
                                    "content": [{"type": "input_text", "text": "SUMMARY"}]}


def test_unknown_items_are_kept_as_they_came():
    unknown = {"type": "some_future_item", "id": "x1", "payload": {"a": [1, 2]}}
    body = {"model": "m", "input": [{"type": "message", "role": "user", "content": "go"}, unknown,
                                    {"type": "message", "role": "user", "content": "again"}]}
    chat = parse(body)
    assert chat.history[1]["opaque"] == [{"type": "some_future_item", "payload": {"a": [1, 2]}}]
    assert fmt.render_body(chat, chat.history, None)["input"] == body["input"]


@pytest.mark.parametrize("body, param", [
    ({"model": 5, "input": "x"}, "model"),
    ({"model": "m", "input": 7}, "input"),
    ({"model": "m", "input": ["x"]}, "input[0]"),
    ({"model": "m", "input": [{"type": "message", "role": "boss", "content": "x"}]}, "input[0].role"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "input": "x", "max_output_tokens": -1}, "max_output_tokens"),
])
def test_what_cannot_be_routed_is_a_400_naming_the_field(body, param):
    with pytest.raises(BadRequest) as caught:
        parse(body)
    assert caught.value.param == param
