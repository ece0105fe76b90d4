"""Response ids on a chat-only upstream (``api = "chat"``) are the gateway's to mint: a server
that sends completions without an id, or with the same id every time, still gives every
response its own id, so every chain continues from its own history."""

from __future__ import annotations

import pytest

from tests.robustness.scripted import Reply, client, last_text, stream_of


def no_id(body: dict) -> Reply:
    """An answer with no completion id at all (llama.cpp-style servers may omit it)."""
    reply = stream_of({"content": f"ok: {last_text(body)[:40]}"})
    if body.get("stream"):
        for event in reply.events:
            if isinstance(event, dict):
                event.pop("id", None)
        return reply
    return Reply(json={"object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": f"ok: {last_text(body)[:40]}"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("script", ["no id", "one id"])
async def test_every_translated_response_gets_its_own_id(scripted, scripted_gateway, stream, script):
    if script == "no id":
        scripted.script = no_id
    gw = await scripted_gateway(models={"m-32k": {"context_window": 32_000, "api": "chat"}})

    async def create(sdk, **kw):
        if not stream:
            return await sdk.responses.create(model="m-32k", store=False, **kw)
        async with sdk.responses.stream(model="m-32k", store=False, **kw) as events:
            return await events.get_final_response()

    first = await create(client(gw, "one"), input="plan one: 7731")
    second = await create(client(gw, "two"), input="plan two: 4242")
    assert first.id != second.id and first.id.startswith("resp_")
    assert {i.id for i in first.output}.isdisjoint(i.id for i in second.output)
    for session, response, mine, other in (("one", first, "7731", "4242"), ("two", second, "4242", "7731")):
        await create(client(gw, session), previous_response_id=response.id, input="and then?")
        sent = str(scripted.chats()[-1]["messages"])
        assert mine in sent and other not in sent
