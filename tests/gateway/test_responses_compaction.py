"""Native compaction emulated on any upstream: Codex's ``compaction_trigger`` and
``POST /v1/responses/compact`` are answered from the gateway's own checkpoint, and the
compaction item, sent back, reaches the upstream as the summary it stands for."""

from __future__ import annotations

import openai

from simulator.workloads import agent_loop_session
from tests.gateway.test_responses import client, gateway_config, responses_bodies
from tests.support.agent import drive_responses_loop, responses_turn, settle


async def loop_items(gw, name: str) -> tuple[list[dict], object]:
    session = agent_loop_session(seed=9, turns=1, calls=30)
    items, _ = await drive_responses_loop(client(gw, name), session, model="fake-32k")
    await settle(gw)
    return items, session


async def test_a_compaction_trigger_gets_one_item_that_expands_into_the_summary(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"))
    c = client(gw, "cx")
    items, session = await loop_items(gw, "cx")
    sent_before = len(responses_bodies(upstream))
    for stream in (False, True):
        output, _ = await responses_turn(c, [*items, {"type": "compaction_trigger"}], model="fake-32k", stream=stream)
        assert [i["type"] for i in output] == ["compaction"]
        assert output[0]["encrypted_content"].startswith("pal1.")
    assert len(responses_bodies(upstream)) == sent_before  # answered by the gateway, no upstream call
    # The client keeps its user messages and the item; the upstream sees the summary, not the item.
    kept = [i for i in items if i.get("role") == "user"]
    follow = [*kept, output[0], {"type": "message", "role": "user", "content": "Where were we?"}]
    answer, response = await responses_turn(c, follow, model="fake-32k")
    assert response.output_text.startswith("ok:")
    body = responses_bodies(upstream)[-1]
    assert not any(i.get("type") == "compaction" for i in body["input"])
    assert any("<session_summary>" in str(i.get("content")) for i in body["input"] if i.get("role") == "developer")
    assert any(fact.answer in str(body["input"]) for fact in session.facts)  # its exact values came along


async def test_a_compaction_item_is_refused_for_another_tenant_and_a_forged_one_passes_on(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"), tenants={"alice": "pk-alice", "bob": "pk-bob"},
                             server={"client_keys": "required"})
    alice = openai.AsyncOpenAI(base_url=gw.base_url, api_key="pk-alice", default_headers={"X-Session-Id": "s"}, max_retries=0)
    bob = openai.AsyncOpenAI(base_url=gw.base_url, api_key="pk-bob", default_headers={"X-Session-Id": "s"}, max_retries=0)
    items = [{"type": "message", "role": "user", "content": "hello"}]
    await responses_turn(alice, items, model="fake-32k")
    output, _ = await responses_turn(alice, [*items, {"type": "compaction_trigger"}], model="fake-32k")
    stolen = [*items, output[0], {"type": "message", "role": "user", "content": "what did alice say?"}]
    try:
        await responses_turn(bob, stolen, model="fake-32k")
        raise AssertionError("bob's request was answered")
    except openai.BadRequestError as exc:
        assert exc.status_code == 400 and "compaction item" in exc.message
    forged = {**output[0], "encrypted_content": output[0]["encrypted_content"][:-4] + "0000"}
    try:
        await responses_turn(alice, [*items, forged], model="fake-32k")
        raise AssertionError("a forged item was expanded")
    except openai.BadRequestError as exc:  # not ours: it went to the provider, which cannot read it
        assert "compaction" in exc.message.lower() or "encrypted" in exc.message.lower()


async def test_the_compact_endpoint_keeps_user_messages_and_adds_one_item(start_gateway, upstream):
    gw = await start_gateway(**gateway_config("responses"))
    c = client(gw, "compact")
    items, _ = await loop_items(gw, "compact")
    compacted = await c.responses.compact(model="fake-32k", input=items)
    kinds = [i.type for i in compacted.output]
    assert kinds[-1] == "compaction" and set(kinds[:-1]) == {"message"}
    assert len(kinds) - 1 == sum(1 for i in items if i.get("role") == "user")
