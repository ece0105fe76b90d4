"""/v1/responses on the simulated provider: strict like OpenAI's, parsed by the openai SDK.

Driven with the official SDK (JSON and streams) and, where the bytes matter, raw aiohttp."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import openai
import orjson
import pytest

from simulator.puppet import PUPPET_STATE, RECEIVED, start_puppet

READ = {"type": "function", "name": "read_file", "description": "read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
ENCRYPTED = ["reasoning.encrypted_content"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire"


@pytest.fixture
async def client(puppet):
    async with openai.AsyncOpenAI(base_url=puppet[1], api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def dumped(output) -> list[dict]:
    return [item.model_dump(exclude_none=True) for item in output]


async def tool_round(client) -> tuple[list[dict], dict, dict]:
    """A user turn the model answers with read_file: (items so far, reasoning, call)."""
    prompt = {"role": "user", "content": 'look [[call read_file {"path": "a.py"}]]'}
    first = await client.responses.create(model="fake-32k", input=[prompt], tools=[READ],
                                          store=False, include=ENCRYPTED)
    reasoning, call = dumped(first.output)
    return [prompt, reasoning, call], reasoning, call


async def test_text_answer_has_output_text_and_usage(client):
    response = await client.responses.create(model="fake-32k", input="hello there")

    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed"
    assert response.output_text == "ok: hello there"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0


async def test_a_call_comes_after_a_signed_reasoning_item_and_the_round_completes(client):
    items, reasoning, call = await tool_round(client)
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
    assert call["type"] == "function_call" and call["name"] == "read_file"
    assert json.loads(call["arguments"]) == {"path": "a.py"}

    items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "print(1)"})
    async with client.responses.stream(model="fake-32k", input=items, tools=[READ], store=False,
                                       include=ENCRYPTED) as stream:
        final = await stream.get_final_response()
    assert final.output_text == "Tool read_file returned: print(1)"


async def test_without_include_there_is_no_reasoning_item(client):
    response = await client.responses.create(
        model="fake-32k", input='[[call read_file {"path": "b"}]]', tools=[READ], store=False)
    assert [item.type for item in response.output] == ["function_call"]


async def test_stream_events_are_named_numbered_and_parsed_by_the_sdk(puppet, http, client):
    body = {"model": "fake-32k", "input": 'x [[call read_file {"path": "long/path/name.py"}]]',
            "tools": [READ], "stream": True, "store": False, "include": ENCRYPTED}
    async with http.post(puppet[1] + "/responses", json=body) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        text = await raw.text()
    events = []
    for block in text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    names = [e["type"] for e in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    assert names.count("response.output_item.added") == names.count("response.output_item.done") == 2
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert len([e for e in events if e["type"] == "response.function_call_arguments.delta"]) > 1
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert deltas == done["arguments"] == '{"path":"long/path/name.py"}'
    assert events[-1]["response"]["output"][1]["arguments"] == deltas

    body.pop("stream")
    async with client.responses.stream(**body) as stream:
        seen = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert seen.count("response.function_call_arguments.delta") > 1
    assert final.output[1].arguments == '{"path":"long/path/name.py"}'


async def test_text_stream_has_content_parts_and_text_deltas(client):
    async with client.responses.stream(model="fake-32k", input="stream me a longer answer") as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == final.output_text == "ok: stream me a longer answer"


async def test_a_call_without_its_output_is_refused(client):
    items, _, call = await tool_round(client)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input=items + [{"role": "user", "content": "go on"}],
                                      tools=[READ], store=False, include=ENCRYPTED)
    assert caught.value.body["message"] == f"No tool output found for function call {call['call_id']}."


async def test_an_output_without_its_call_is_refused(client):
    stray = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input=[{"role": "user", "content": "hi"}, stray])
    assert "No tool call found for function call output with call_id call_nowhere." == caught.value.body["message"]


async def test_a_call_replayed_without_its_reasoning_item_is_refused(client):
    items, reasoning, call = await tool_round(client)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input=[items[0], call, output],
                                      tools=[READ], store=False, include=ENCRYPTED)
    assert caught.value.body["message"] == (
        f"Item '{call['id']}' of type 'function_call' was provided without its required "
        f"'reasoning' item: '{reasoning['id']}'.")


async def test_a_reasoning_item_without_its_call_is_refused(client):
    items, reasoning, _ = await tool_round(client)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input=[items[0], reasoning,
                                                               {"role": "user", "content": "next"}],
                                      store=False, include=ENCRYPTED)
    assert caught.value.body["message"] == (
        f"Item '{reasoning['id']}' of type 'reasoning' was provided without its required following item.")


async def test_a_reasoning_item_followed_by_its_call_without_the_item_id_is_accepted(client):
    """The Vercel AI SDK with ``store: false`` resends a call as ``{type, call_id, name,
    arguments}``, without the item id: the reasoning item before it still has its following item.
    Another answer's call (an id it does not bind) does not stand in for it."""
    items, reasoning, call = await tool_round(client)
    bare = {k: call[k] for k in ("type", "call_id", "name", "arguments")}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    answer = await client.responses.create(model="fake-32k", input=[items[0], reasoning, bare, output],
                                           tools=[READ], store=False, include=ENCRYPTED)
    assert answer.status == "completed"
    other = {**call, "id": "fc_other"}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input=[items[0], reasoning, other, output],
                                      tools=[READ], store=False, include=ENCRYPTED)
    assert "without its required following item" in caught.value.body["message"]


async def test_tampered_or_foreign_encrypted_content_is_refused(client):
    items, reasoning, call = await tool_round(client)
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    other_runner, other_url = await start_puppet()
    try:
        async with openai.AsyncOpenAI(base_url=other_url, api_key="k", max_retries=0) as other:
            _, foreign, _ = await tool_round(other)
    finally:
        await other_runner.cleanup()
    body = reasoning["encrypted_content"]
    for content in (body[:-1] + ("0" if body[-1] != "0" else "1"), foreign["encrypted_content"]):
        tampered = {**reasoning, "encrypted_content": content}
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="fake-32k", input=[items[0], tampered, call, output],
                                          tools=[READ], store=False, include=ENCRYPTED)
        assert caught.value.code == "invalid_encrypted_content"
        assert caught.value.body["message"] == f"The encrypted content for item '{reasoning['id']}' could not be verified."


async def test_over_the_window_is_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="tiny", input="word " * 400)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.body["param"] == "input"
    # max_output_tokens counts against the window too
    fits = await client.responses.create(model="tiny", input="word " * 200)
    assert fits.usage.input_tokens < 300
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="tiny", input="word " * 200, max_output_tokens=200)


async def test_previous_response_id_chains_stored_responses(client):
    first = await client.responses.create(model="fake-32k", input='[[call read_file {"path": "c"}]]',
                                          tools=[READ])
    call = first.output[0]
    # Only the output goes in input: the call comes from the stored chain.
    second = await client.responses.create(
        model="fake-32k", previous_response_id=first.id, tools=[READ],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "contents"}])
    assert second.output_text == "Tool read_file returned: contents"
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens

    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", input="x", previous_response_id="resp_unknown")
    assert caught.value.body["message"] == "Previous response with id 'resp_unknown' not found."
    unstored = await client.responses.create(model="fake-32k", input="x", store=False)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="fake-32k", input="y", previous_response_id=unstored.id)


async def test_stored_responses_can_be_read_listed_and_deleted(client):
    first = await client.responses.create(model="fake-32k", input="one")
    second = await client.responses.create(model="fake-32k", input="two", previous_response_id=first.id)
    assert (await client.responses.retrieve(second.id)).output_text == "ok: two"
    listed = await client.responses.input_items.list(second.id)
    texts = [item.content[0].text if item.type == "message" and not isinstance(item.content, str)
             else None for item in listed.data]
    assert [item.id for item in listed.data][0] == listed.data[0].id and len(listed.data) == 3
    assert texts[-1] == "one" and texts[1] == "ok: one"  # newest first
    deleted = await client.responses.delete(second.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(second.id)


async def test_compaction_items_are_issued_signed_and_checked(client, puppet, http):
    items, _, call = await tool_round(client)
    items.append({"type": "function_call_output", "call_id": call["call_id"], "output": "x = 1"})
    async with http.post(puppet[1] + "/responses/compact",
                         json={"model": "fake-32k", "input": items}) as raw:
        compacted = await raw.json()
    assert raw.status == 200 and compacted["object"] == "response.compaction"
    kept, item = compacted["output"][:-1], compacted["output"][-1]
    assert [k["content"] for k in kept] == [items[0]["content"]]
    assert item["type"] == "compaction" and item["encrypted_content"]
    later = await client.responses.create(model="fake-32k", store=False,
                                          input=[*kept, item, {"role": "user", "content": "continue"}])
    assert later.output_text == "ok: continue"

    token = item["encrypted_content"]
    # The signature is hex: a different last digit always breaks it (a fixed "00" was the
    # signature itself once in 256 runs).
    tampered = {**item, "encrypted_content": token[:-1] + ("1" if token[-1] != "1" else "2")}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="fake-32k", store=False,
                                      input=[tampered, {"role": "user", "content": "continue"}])
    assert caught.value.code == "invalid_encrypted_content"


async def test_a_compaction_trigger_is_answered_with_one_compaction_item(client):
    response = await client.responses.create(
        model="fake-32k", store=False,
        input=[{"role": "user", "content": "Goal: ship it"}, {"type": "compaction_trigger"}])
    assert [item.type for item in response.output] == ["compaction"]


async def test_cached_tokens_follow_the_prefix_rule(client):
    long_text = "alpha beta gamma delta " * 400
    items = [{"role": "developer", "content": long_text}, {"role": "user", "content": "first"}]
    first = await client.responses.create(model="fake-128k", input=items, store=False)
    assert first.usage.input_tokens_details.cached_tokens == 0
    items += [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "second"}]
    second = await client.responses.create(model="fake-128k", input=items, store=False)
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached < second.usage.input_tokens


async def test_summary_calls_are_answered_with_the_requested_headings(client):
    instructions = "Summarise.\n## Goal\n## Next step\nStay under 200 words."
    response = await client.responses.create(
        model="fake-32k", instructions=instructions, store=False,
        input="user: Goal is to migrate the billing service. Next we run the dry-run.",
        extra_headers={"x-palimpsest-purpose": "summary"})
    headings = [line for line in response.output_text.splitlines() if line.startswith("## ")]
    assert headings == ["## Goal", "## Next step"]


@pytest.mark.parametrize("change, message", [
    (lambda b: b.pop("model"), "Missing required parameter: 'model'."),
    (lambda b: b.update(include=["reasoning.everything"]), "Invalid value: 'reasoning.everything'."),
    (lambda b: b.update(tools=[{"type": "function", "function": {"name": "f"}}]),
     "Missing required parameter: 'tools[0].name'."),
    (lambda b: b.update(max_output_tokens=5), "integer below minimum value"),
    (lambda b: b.update(input=[{"type": "teleport"}]), "Invalid value: 'teleport'."),
    (lambda b: b.update(input=[{"role": "robot", "content": "x"}]), "Invalid value: 'robot'."),
    (lambda b: b.update(input=42), "Invalid type for 'input'"),
])
async def test_malformed_bodies_get_400_in_openai_envelope(puppet, http, change, message):
    body = {"model": "fake-32k", "input": "hi"}
    change(body)
    async with http.post(puppet[1] + "/responses", json=body) as raw:
        error = (await raw.json())["error"]
    assert raw.status == 400 and error["type"] == "invalid_request_error"
    assert message in error["message"]


async def test_injected_failures_pass_as_statuses(client, puppet):
    with pytest.raises(openai.InternalServerError):
        await client.responses.create(model="fake-32k", input="now [[fail 500]]")
    puppet[0][PUPPET_STATE].failures.append(429)
    with pytest.raises(openai.RateLimitError):
        await client.responses.create(model="fake-32k", input="fine")


async def test_the_request_codex_really_sends_is_accepted_and_its_fake_reasoning_refused(puppet, http):
    recorded = json.loads((FIXTURES / "codex-tool-round.json").read_text())
    body = copy.deepcopy(recorded["body"])
    headers = {k: v for k, v in recorded["headers"].items() if k.lower().startswith(("session", "thread", "x-codex"))}
    body["input"] = body["input"][:-3]  # up to the prompt, before the recorder's tool round
    async with http.post(puppet[1] + "/responses", json=body, headers=headers) as raw:
        text = await raw.text()
    assert raw.status == 200, text
    completed = json.loads(text.strip().split("\n\n")[-1].split("data: ", 1)[1])["response"]
    assert [item["type"] for item in completed["output"]] == ["reasoning", "function_call"]
    assert completed["output"][1]["name"] == "exec_command"

    # The recorder's reasoning item carried made-up encrypted content: a real provider refuses it.
    async with http.post(puppet[1] + "/responses", json=recorded["body"]) as raw:
        error = (await raw.json())["error"]
    assert raw.status == 400 and error["code"] == "invalid_encrypted_content"
    assert len(puppet[0][RECEIVED]) == 2
    assert orjson.loads(puppet[0][RECEIVED][0]["body"])["include"] == ENCRYPTED


async def test_references_resolve_only_to_stored_items(client):
    first = await client.responses.create(model="fake-32k", input="remember this")
    reference = {"type": "item_reference", "id": first.output[0].id}
    later = await client.responses.create(model="fake-32k", input=[reference, {"role": "user", "content": "and?"}])
    assert later.output_text == "ok: and?"
    for item, message in (({"type": "item_reference", "id": "msg_gone"}, "Item with id 'msg_gone' not found."),
                          ({"type": "reasoning", "id": "rs_gone", "summary": []},
                           "Item with id 'rs_gone' not found. Items are not persisted when `store` is set to false.")):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="fake-32k", store=False,
                                          input=[item, {"role": "user", "content": "x"}])
        assert caught.value.body["message"].startswith(message)
