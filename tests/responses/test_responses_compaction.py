"""Native compaction emulated on any upstream: Codex's ``compaction_trigger`` and
``POST /v1/responses/compact`` are answered from the gateway's own checkpoint, and the
compaction item, sent back, reaches the upstream as the summary it stands for."""

from __future__ import annotations

import base64

import aiohttp
import openai
import pytest

from gateway.keys import LEDGER
from simulator.puppet import RECEIVED

from simulator.workloads import agent_loop_session
from store.records import SessionRef
from tests.responses.test_responses import client, gateway_config, responses_bodies
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
        assert output[0]["encrypted_content"].startswith("pal2.")
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


TENANTS = {"alice": "pk-alice", "bob": "pk-bob"}


async def tenants_gateway(start_gateway, **sections):
    return await start_gateway(**gateway_config("responses"), tenants=TENANTS, server={"client_keys": "required"}, **sections)


def sdk(gw, key: str, session: str | None) -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, default_headers=headers, max_retries=0)


async def compact_raw(gw, key: str, body: dict, session: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}", **({"X-Session-Id": session} if session else {})}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/responses/compact", json=body, headers=headers) as response:
            return response.status, await response.text()


@pytest.mark.parametrize("operator_key", [False, True])
@pytest.mark.parametrize("session,given", [(None, "x"), ("bob-s", []), ("bob-s", "x")])
async def test_compact_refuses_another_tenants_previous_response_id(start_gateway, upstream, session, given, operator_key):
    gw = await tenants_gateway(start_gateway, **({"upstream": {"api_key": "sk-operator"}} if operator_key else {}))
    first = await sdk(gw, "pk-alice", "alice-s").responses.create(model="fake-32k", input="alice's secret plan: 7731")
    sent = len(upstream.app[RECEIVED])
    status, text = await compact_raw(gw, "pk-bob", {"model": "fake-32k", "previous_response_id": first.id, "input": given},
                                     session=session)
    assert status == 400 and "previous_response_not_found" in text
    assert "7731" not in text
    assert len(upstream.app[RECEIVED]) == sent  # nothing of it reached the upstream
    assert not [s for s in gw.app[LEDGER].sessions() if s.tenant == "bob" and s.events]  # nothing stored for bob


@pytest.mark.parametrize("session", [None, "alice-s"])
async def test_compact_continues_the_tenants_own_previous_response_id_from_the_ledger(start_gateway, upstream, session):
    gw = await tenants_gateway(start_gateway)
    alice = sdk(gw, "pk-alice", "alice-s")
    first = await alice.responses.create(model="fake-32k", input="alice's plan: 7731", store=False)
    sent = len(responses_bodies(upstream))
    compacted = await sdk(gw, "pk-alice", session).responses.compact(model="fake-32k", previous_response_id=first.id,
                                                                    input="and then?")
    assert len(responses_bodies(upstream)) == sent  # answered from the gateway's ledger
    kinds = [i.type for i in compacted.output]
    assert kinds == ["message", "message", "compaction"]  # both user messages of the chain, then the item
    assert [i.content for i in compacted.output[:2]] == ["alice's plan: 7731", "and then?"]
    follow = [*(i.model_dump(exclude_none=True, warnings=False) for i in compacted.output),
              {"type": "message", "role": "user", "content": "go on"}]
    await responses_turn(sdk(gw, "pk-alice", "alice-s"), follow, model="fake-32k")
    body = responses_bodies(upstream)[-1]
    assert not any(i.get("type") == "compaction" for i in body["input"])  # expanded by the gateway
    assert any("<session_summary>" in str(i.get("content")) for i in body["input"] if i.get("role") == "developer")
    assert "ok: alice's plan" in str(body["input"])  # the chain's answer, from the ledger


async def test_compact_refuses_another_tenants_compaction_item_and_stores_nothing(start_gateway, upstream):
    gw = await tenants_gateway(start_gateway)
    items = [{"type": "message", "role": "user", "content": "alice's secret plan: 7731"}]
    alice = sdk(gw, "pk-alice", "s")
    await responses_turn(alice, items, model="fake-32k")
    output, _ = await responses_turn(alice, [*items, {"type": "compaction_trigger"}], model="fake-32k")
    for session in ("s", None):
        status, text = await compact_raw(gw, "pk-bob", {"model": "fake-32k", "input": [output[0]]}, session=session)
        assert status == 400 and "compaction item" in text and "7731" not in text
    assert not [s for s in gw.app[LEDGER].sessions() if s.tenant == "bob" and s.events]


async def test_a_compaction_item_does_not_reveal_its_tenant_or_session(start_gateway, upstream):
    gw = await tenants_gateway(start_gateway)
    items = [{"type": "message", "role": "user", "content": "hello"}]
    alice = sdk(gw, "pk-alice", "alice-private-session")
    await responses_turn(alice, items, model="fake-32k")
    output, _ = await responses_turn(alice, [*items, {"type": "compaction_trigger"}], model="fake-32k")
    compacted = await alice.responses.compact(model="fake-32k", input=items)
    for item in (output[0], compacted.output[-1].model_dump()):
        content = item["encrypted_content"]
        readable = [content]
        for part in content.split("."):
            for decode in (base64.urlsafe_b64decode, base64.b64decode):
                try:
                    readable.append(decode(part + "=" * (-len(part) % 4)).decode("latin-1"))
                except ValueError:
                    pass
        for text in readable:
            assert "alice" not in text and "alice-private-session" not in text
            assert not any(e.id in text for s in gw.app[LEDGER].sessions() for e in gw.app[LEDGER].since(s.key, -1))


async def admin_get(gw, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.root + path, headers={"Authorization": "Bearer adm"}) as response:
            return response.status, await response.json(content_type=None)


async def assert_inspectable(gw, record) -> None:
    from tests.ops.test_inspect_recorded import inspect

    path = f"/admin/sessions/{record.key}"
    status, detail = await admin_get(gw, path)
    assert status == 200, detail
    assert detail["events"]
    status, view = await admin_get(gw, path + "/view")
    assert status == 200, view
    assert view["tokens"]["client"] > 0
    assert (await inspect(gw.settings.store.path, record.key))["events"]
    assert (await inspect(gw.settings.store.path, record.key, "--view"))["tokens"]["client"] > 0


@pytest.mark.parametrize("how", ["trigger", "endpoint"])
async def test_a_session_that_used_the_gateways_compaction_can_be_inspected(start_gateway, upstream, how):
    gw = await start_gateway(**gateway_config("responses"), server={"admin_token": "adm"})
    c = client(gw, f"inspect-{how}")
    items, _ = await loop_items(gw, f"inspect-{how}")
    if how == "trigger":
        output, _ = await responses_turn(c, [*items, {"type": "compaction_trigger"}], model="fake-32k")
        kept = [*(i for i in items if i.get("role") == "user"), output[0]]
    else:
        compacted = await c.responses.compact(model="fake-32k", input=items)
        kept = [i.model_dump(exclude_none=True, warnings=False) for i in compacted.output]
    answer, _ = await responses_turn(c, [*kept, {"type": "message", "role": "user", "content": "Where were we?"}],
                                     model="fake-32k")
    await responses_turn(c, [*kept, {"type": "message", "role": "user", "content": "Where were we?"}, *answer,
                             {"type": "message", "role": "user", "content": "And then?"}], model="fake-32k")
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == f"inspect-{how}")
    # The summary block the item stood for went upstream as an instruction, never into the ledger.
    assert any("<session_summary>" in str(i.get("content")) for i in responses_bodies(upstream)[-1]["input"])
    assert not [e for e in gw.app[LEDGER].since(record.key, -1) if e.role in ("system", "developer")]
    await assert_inspectable(gw, record)


async def test_a_ledger_holding_a_summary_event_from_an_earlier_release_can_be_inspected(start_gateway, upstream):
    """Stores written before the summary became an instruction hold it as a system-role event."""
    gw = await start_gateway(**gateway_config("responses"), server={"admin_token": "adm"})
    block = "<session_summary>\nWhat came before.\n</session_summary>"
    summary = {"role": "system", "content": block, "wire": {"format": "responses", "items": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": block}]}]}}
    messages = [{"role": "user", "content": "first"}, summary, {"role": "assistant", "content": "noted"},
                {"role": "user", "content": "next"}]
    gw.app[LEDGER].sync(SessionRef("sk-legacy", "legacy"), messages, model="fake-32k")
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "legacy")
    await assert_inspectable(gw, record)


async def test_compact_without_a_session_goes_to_the_provider_like_every_request(start_gateway, upstream):
    """No session and no state of the gateway's named: the provider's own /compact answers, by
    the same relay as every request (the tenant's upstream key, the gateway's headers, counted
    in the request metrics), its error passed through as it came."""
    gw = await start_gateway(**gateway_config("responses"), upstream={"api_key": "sk-operator"},
                             tenants={"beta": {"key": "pk-beta", "upstream_key": "sk-beta-own"}},
                             server={"metrics_open": True})
    headers = {"Authorization": "Bearer pk-beta", "X-Request-Id": "req-compact-1"}
    body = {"model": "fake-32k", "input": [{"type": "message", "role": "user", "content": "hello there"}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/responses/compact", json=body, headers=headers) as response:
            assert response.status == 200
            assert response.headers["x-request-id"] == "req-compact-1"
            compacted = await response.json()
        huge = {"model": "fake-8k", "input": [{"type": "message", "role": "user", "content": "word " * 40_000}]}
        async with http.post(f"{gw.base_url}/responses/compact", json=huge, headers=headers) as response:
            refused_status, refused = response.status, await response.json()
        async with http.get(gw.root + "/metrics") as r:
            metrics = await r.text()
    assert compacted["object"] == "response.compaction" and compacted["id"].startswith("resp_puppet")
    assert [i["type"] for i in compacted["output"]] == ["message", "compaction"]
    sent = [r for r in upstream.received if r["path"] == "/v1/responses/compact"]
    assert len(sent) == 2 and all(r["headers"]["authorization"] == "Bearer sk-beta-own" for r in sent)
    assert sent[0]["json"] == body
    assert refused_status == 400 and refused["error"]["code"] == "context_length_exceeded"  # the provider's own
    assert 'palimpsest_requests_total{model="fake-32k",route="responses",status="200",upstream="default"} 1.0' in metrics
    assert 'route="responses",status="400"' in metrics
    assert not [s for s in gw.app[LEDGER].sessions() if s.events]  # nothing stored: no session
