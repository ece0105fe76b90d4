"""A new user whose upstream cannot take tools, and the recall tools the gateway adds.

vLLM served without ``--enable-auto-tool-choice``, an Ollama model without tool support and
several llama.cpp setups answer 400 to any request that carries ``tools``. A client that sends
no tools works with them directly; through the gateway it worked only until its history got
long enough to be hidden, because from then on every view carried ``session_search`` and
``session_load``, and every request failed with the upstream's 400. The gateway must answer
such a client from the view without recall tools (proactive recall still adds passages), and
learn not to offer them to that model again.
"""

from __future__ import annotations

import openai
import pytest

from tests.robustness.scripted import Reply, answer, client

FILLER = "lorem ipsum dolor sit amet " * 100
LONG = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {FILLER}"} for i in range(24)]
VLLM_400 = {"error": {"object": "error", "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                      "type": "BadRequestError", "param": None, "code": 400}}


def no_tools_upstream(body: dict) -> Reply:
    if body.get("tools"):
        return Reply(status=400, json=VLLM_400)
    return answer(body, {"content": "answered without tools"})


async def _ask(sdk, messages: list[dict], stream: bool) -> str:
    if not stream:
        reply = await sdk.chat.completions.create(model="m-8k", messages=messages)
        return reply.choices[0].message.content
    text = ""
    async for event in await sdk.chat.completions.create(model="m-8k", messages=messages, stream=True):
        for choice in event.choices:
            text += choice.delta.content or ""
    return text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_upstream_without_tool_support_still_answers_a_long_session(scripted, scripted_gateway, stream):
    gw = await scripted_gateway()
    scripted.script = no_tools_upstream
    sdk = client(gw)
    messages = [*LONG, {"role": "user", "content": "and now?"}]
    assert await _ask(sdk, messages, stream) == "answered without tools"
    first = scripted.chats()
    assert [bool(body.get("tools")) for body in first] == [True, False]  # offered once, then answered without
    assert first[1]["messages"] == first[0]["messages"]  # the same view, only the tools gone
    assert "tool_choice" not in first[1] and "parallel_tool_calls" not in first[1]
    # The model is remembered: the next request of any session goes without recall tools at once.
    messages += [{"role": "assistant", "content": "answered without tools"}, {"role": "user", "content": "more?"}]
    assert await _ask(client(gw, "other-session"), messages, stream) == "answered without tools"
    assert [bool(body.get("tools")) for body in scripted.chats()[2:]] == [False]


async def test_a_client_with_tools_of_its_own_gets_the_upstream_400_unchanged(scripted, scripted_gateway):
    """The 400 is the client's to see when its own tools are refused: no retry without them."""
    gw = await scripted_gateway()
    scripted.script = no_tools_upstream
    tools = [{"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client(gw).chat.completions.create(model="m-8k", messages=[*LONG, {"role": "user", "content": "go"}], tools=tools)
    assert "enable-auto-tool-choice" in caught.value.message
    assert len(scripted.chats()) == 1


async def test_a_400_for_another_reason_is_relayed_without_a_retry(scripted, scripted_gateway):
    """An error that does not name tools is the client's: relayed as it came, no second call,
    and the model keeps its recall tools."""
    gw = await scripted_gateway()
    bad = {"error": {"message": "temperature must be at most 2", "type": "invalid_request_error", "param": "temperature", "code": None}}
    scripted.script = lambda body: Reply(status=400, json=bad)
    sdk = client(gw)
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.chat.completions.create(model="m-8k", messages=[*LONG, {"role": "user", "content": "go"}], temperature=5)
        assert caught.value.body["message"] == bad["error"]["message"]
    assert [bool(body.get("tools")) for body in scripted.chats()] == [True, True]
