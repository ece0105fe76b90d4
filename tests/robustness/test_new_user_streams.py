"""A new user's streams off the happy path, through the plain relay and the recall loop.

Each case runs twice: with a short history (the view is the client's request, relayed as it
comes) and with a long one on an 8k model (the view hides history, so it carries the recall
tools and the answer goes through ``RecallLoop``, which rewrites every chunk). A client must
not be able to tell the two apart: what the provider streamed reaches the client (legacy
``function_call`` deltas, refusals, reasoning text, the provider's own error event), and what
the ledger records is the answer the client got, so the resent history lands on it.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from gateway.keys import LEDGER
from store.canonical import event_id
from tests.robustness.scripted import Reply, add_call_deltas, answer, chunk, client

FILLER = "lorem ipsum dolor sit amet " * 100
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {FILLER}"} for i in range(24)]
HISTORIES = {"short": [], "long": LONG}
FUNCTIONS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def _recall_offered(scripted, history: str) -> None:
    """The long history really went through the recall loop (and the short one did not)."""
    tools = [t["function"]["name"] for t in scripted.chats()[0].get("tools") or ()]
    assert ("session_search" in tools) == (history == "long"), tools


def _answers(gw) -> list[dict]:
    ledger = gw.app[LEDGER]
    out = []
    for record in ledger.sessions():
        out += [e.message for e in ledger.since(record.key, -1) if e.role == "assistant" and e.kind == "message"]
    return out


async def _drain(stream) -> dict[str, Any]:
    got: dict[str, Any] = {"content": "", "refusal": "", "reasoning": "", "fc_name": "", "fc_args": "", "finish": None, "chunks": 0}
    async for event in stream:
        got["chunks"] += 1
        for choice in event.choices:
            delta = choice.delta
            got["content"] += delta.content or ""
            got["refusal"] += delta.refusal or ""
            got["reasoning"] += (delta.model_extra or {}).get("reasoning_content") or ""
            if delta.function_call:
                got["fc_name"] += delta.function_call.name or ""
                got["fc_args"] += delta.function_call.arguments or ""
            got["finish"] = choice.finish_reason or got["finish"]
    return got


def _legacy_call_stream(body: dict) -> Reply:
    if body["messages"][-1]["role"] == "function":
        return answer(body, {"content": "sunny"})
    return Reply(events=[
        chunk({"role": "assistant", "content": None}),
        chunk({"function_call": {"name": "get_weather", "arguments": ""}}),
        chunk({"function_call": {"arguments": '{"city": '}}),
        chunk({"function_call": {"arguments": '"Paris"}'}}),
        chunk({}, finish="function_call"), "[DONE]"])


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_streamed_legacy_function_call_reaches_the_client_and_the_ledger(scripted, scripted_gateway, history):
    gw = await scripted_gateway()
    scripted.script = _legacy_call_stream
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "weather in Paris?"}]
    got = await _drain(await sdk.chat.completions.create(model="m-8k", messages=messages, functions=FUNCTIONS, stream=True))
    _recall_offered(scripted, history)
    assert (got["fc_name"], got["fc_args"], got["finish"]) == ("get_weather", '{"city": "Paris"}', "function_call")
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert _answers(gw)[-1] == {"role": "assistant", "function_call": call}
    # The client resends the call with its result: it lands on the recorded event (one branch).
    messages += [{"role": "assistant", "content": None, "function_call": call},
                 {"role": "function", "name": "get_weather", "content": "22C"}]
    reply = await sdk.chat.completions.create(model="m-8k", messages=messages, functions=FUNCTIONS)
    assert reply.choices[0].message.content == "sunny"
    assert scripted.chats()[-1]["messages"][-2]["function_call"] == call
    ledger = gw.app[LEDGER]
    (record,) = ledger.sessions()
    assert len(ledger.heads(record.key)) == 1


def test_two_legacy_function_calls_are_two_events():
    """A regenerated answer that calls another function is another event (a branch), not the
    first one under a shared content address."""
    parent = event_id(None, {"role": "user", "content": "weather?"})
    paris = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    rome = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    assert event_id(parent, paris) != event_id(parent, rome)
    # SDK noise still does not matter.
    assert event_id(parent, {**paris, "refusal": None, "tool_calls": None}) == event_id(parent, paris)


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_streamed_refusal_and_reasoning_reach_the_client_and_the_ledger(scripted, scripted_gateway, history):
    gw = await scripted_gateway()
    scripted.script = lambda body: Reply(events=[
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "the user asks for "}), chunk({"reasoning_content": "something I must not do"}),
        chunk({"refusal": "I can't"}), chunk({"refusal": " help with that."}),
        chunk({}, finish="stop"), "[DONE]"])
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "do the forbidden thing"}]
    got = await _drain(await sdk.chat.completions.create(model="m-8k", messages=messages, stream=True))
    _recall_offered(scripted, history)
    assert (got["refusal"], got["reasoning"], got["finish"]) == ("I can't help with that.", "the user asks for something I must not do", "stop")
    assert _answers(gw)[-1]["refusal"] == "I can't help with that."


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_provider_error_event_reaches_the_client_as_the_provider_said_it(scripted, scripted_gateway, history):
    gw = await scripted_gateway()
    error = {"message": "The server is overloaded, try again", "type": "server_error", "param": None, "code": "overloaded_x"}
    scripted.script = lambda body: Reply(events=[chunk({"role": "assistant", "content": ""}), {"error": error}])
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "hello"}]
    with pytest.raises(openai.APIError) as caught:
        await _drain(await sdk.chat.completions.create(model="m-8k", messages=messages, stream=True))
    _recall_offered(scripted, history)
    assert caught.value.message == error["message"]
    assert caught.value.code == "overloaded_x"
    assert _answers(gw)[-1]["content"].startswith("turn 23") if history == "long" else _answers(gw) == []
    assert len(scripted.chats()) == 1


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_done_without_finish_reason_ends_the_stream_normally(scripted, scripted_gateway, history):
    """A provider that ends its stream with [DONE] but never names a finish_reason: the client
    gets the content and a normal end of stream (no invented finish_reason, no error)."""
    gw = await scripted_gateway()
    scripted.script = lambda body: Reply(events=[chunk({"role": "assistant", "content": ""}), chunk({"content": "all done"}), "[DONE]"])
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "hello"}]
    got = await _drain(await sdk.chat.completions.create(model="m-8k", messages=messages, stream=True))
    _recall_offered(scripted, history)
    assert (got["content"], got["finish"]) == ("all done", None)
    assert _answers(gw)[-1] == {"role": "assistant", "content": "all done"}


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_parallel_client_calls_split_across_many_chunks_arrive_whole(scripted, scripted_gateway, history):
    """Four parallel tool calls whose arguments arrive in ~25 pieces each, then usage."""
    gw = await scripted_gateway()
    calls = [{"id": f"call_{k}", "type": "function", "function": {"name": "fetch", "arguments": json.dumps({"q": "x" * 50, "k": k})}}
             for k in range(4)]
    from tests.robustness.scripted import stream_of
    scripted.script = lambda body: stream_of({"content": None, "tool_calls": calls}, finish="tool_calls", pieces=25)
    tools = [{"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {}}}}]
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "fetch four"}]
    stream = await sdk.chat.completions.create(model="m-8k", messages=messages, tools=tools, stream=True,
                                               stream_options={"include_usage": True})
    got: dict[int, dict] = {}
    usage = finish = None
    async for event in stream:
        usage = event.usage or usage
        for choice in event.choices:
            finish = choice.finish_reason or finish
            add_call_deltas(got, choice.delta.tool_calls)
    _recall_offered(scripted, history)
    assert [got[i] for i in sorted(got)] == calls
    assert finish == "tool_calls" and usage is not None and usage.prompt_tokens == 10
    assert _answers(gw)[-1]["tool_calls"] == calls


def _gemini_call(call_id: str, name: str, arguments: str) -> dict:
    """A tool-call delta as Gemini's OpenAI-compatible stream sends it: no index, the whole
    call at once, a thought signature the next request must carry back."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments},
            "extra_content": {"google": {"thought_signature": f"sig-{call_id}"}}}


@pytest.mark.parametrize("history", sorted(HISTORIES))
async def test_parallel_tool_calls_without_index_stay_apart(scripted, scripted_gateway, history):
    """Two parallel calls, each in its own chunk and neither with an index, finished with
    "stop": two calls for the client and the ledger, not one with both names and arguments."""
    gw = await scripted_gateway()
    calls = [_gemini_call("g1", "fetch", '{"q": "paris"}'), _gemini_call("g2", "fetch", '{"q": "rome"}')]
    scripted.script = lambda body: Reply(events=[
        chunk({"role": "assistant", "tool_calls": [calls[0]]}), chunk({"tool_calls": [calls[1]]}), chunk({}, finish="stop"), "[DONE]"])
    tools = [{"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {}}}}]
    sdk = client(gw)
    messages = [*HISTORIES[history], {"role": "user", "content": "fetch both"}]
    got: dict[Any, dict] = {}
    async for event in await sdk.chat.completions.create(model="m-8k", messages=messages, tools=tools, stream=True):
        for choice in event.choices:
            for delta in choice.delta.tool_calls or ():
                got.setdefault(delta.index if history == "long" else delta.id, {"id": delta.id, "args": ""})["args"] += delta.function.arguments or ""
    _recall_offered(scripted, history)
    assert sorted((g["id"], g["args"]) for g in got.values()) == [("g1", '{"q": "paris"}'), ("g2", '{"q": "rome"}')]
    if history == "long":  # the gateway rewrites the chunks: they get the index they lacked
        assert sorted(got) == [0, 1]
    recorded = _answers(gw)[-1]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"], c["extra_content"]) for c in recorded] == \
        [(c["id"], c["function"]["arguments"], c["extra_content"]) for c in calls]


async def test_recall_call_without_index_goes_back_with_its_thought_signature(scripted, scripted_gateway):
    """The recall round's call, resent in the next upstream request, keeps what the provider
    attached to it (Gemini rejects a function call that lost its thought signature)."""
    gw = await scripted_gateway()

    def script(body: dict) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(events=[chunk({"role": "assistant", "content": "found it"}), chunk({}, finish="stop"), "[DONE]"])
        return Reply(events=[chunk({"role": "assistant", "tool_calls": [_gemini_call("r1", "session_search", '{"query": "turn 3"}')]}),
                             chunk({}, finish="stop"), "[DONE]"])

    scripted.script = script
    got = await _drain(await client(gw).chat.completions.create(model="m-8k", messages=[*LONG, {"role": "user", "content": "turn 3?"}], stream=True))
    assert got["content"] == "found it"
    resent = scripted.chats()[1]["messages"]
    call = next(m for m in resent if m.get("tool_calls"))["tool_calls"][0]
    assert call["id"] == "r1" and call["extra_content"] == {"google": {"thought_signature": "sig-r1"}}
