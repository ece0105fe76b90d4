"""Who may use the gateway, and whose conversation a request belongs to.

Users behind one key who open with the same words must not share a session (the fingerprint
fallback is off unless asked for), and a gateway holding the operator's upstream key must not
lend it to clients without one of its own keys.
"""

from __future__ import annotations

import aiohttp
import openai
import pytest

from gateway.keys import LEDGER

SECRET_PIN = "4921"
TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


def sdk(gw, key: str = "sk-shared-team-key", session: str | None = None) -> openai.AsyncOpenAI:
    headers = {"X-Session-Id": session} if session else {}
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0, default_headers=headers)


def conversation(first_output: str, last: str) -> list[dict]:
    """Opens with "Hi", then rounds whose first tool result is big enough to be compacted
    away (so recall tools are offered on a session), then `last`."""
    messages: list[dict] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    for i in range(5):
        output = (first_output if i == 0 else "") + f" row {i} of the statement." * (900 if i == 0 else 5)
        messages += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "bank"}'}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
            {"role": "assistant", "content": f"noted {i}"},
        ]
    return messages + [{"role": "user", "content": last}]


async def test_same_key_same_first_message_never_share_recall(gateway, upstream):
    alice = conversation(f"Alice's bank PIN is {SECRET_PIN}, IBAN DE89370400440532013000.", "thanks")
    await sdk(gateway).chat.completions.create(model="fake-8k", messages=alice, tools=[TOOL])
    bob = conversation("Bob's statement has nothing secret in it.", "RECALL: what is the bank PIN?")
    answer = await sdk(gateway).chat.completions.create(model="fake-8k", messages=bob, tools=[TOOL])
    assert SECRET_PIN not in (answer.choices[0].message.content or "")
    # Without a session header nothing is recorded, and Bob's request went out as he sent it.
    assert gateway.app[LEDGER].sessions() == []
    sent = upstream.chat_requests()[-1]["json"]
    assert {t["function"]["name"] for t in sent["tools"]} == {"read_file"}
    assert SECRET_PIN not in str(sent)


async def test_fingerprint_fallback_is_explicit_and_per_credential(start_gateway):
    gw = await start_gateway(session={"fallback": "fingerprint"})
    for key in ("sk-alice", "sk-bob"):
        await sdk(gw, key).chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "Hi"}])
    sessions = gw.app[LEDGER].sessions()
    assert len(sessions) == 2 and len({s.tenant for s in sessions}) == 2
    assert all(s.session_id.startswith("fp:") for s in sessions)


@pytest.fixture
async def guarded(start_gateway):
    return await start_gateway(upstream={"api_key": "sk-operator-secret"}, tenants={"team-a": "sk-team-a"})


@pytest.mark.parametrize("key", [None, "sk-not-listed"], ids=["missing", "unknown"])
async def test_operator_key_is_not_an_open_relay(guarded, upstream, key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        for method, path, json_body in (("POST", "/chat/completions", body), ("GET", "/models", None)):
            async with s.request(method, guarded.base_url + path, json=json_body, headers=headers) as r:
                assert r.status == 401
                error = (await r.json())["error"]
                assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
                assert "sk-" not in error["message"]  # the key is never echoed
    assert upstream.received == []  # the operator's key was not spent
    assert guarded.app[LEDGER].sessions() == []


async def test_listed_client_key_uses_the_operator_key_upstream(guarded, upstream):
    result = await sdk(guarded, "sk-team-a", session="s").chat.completions.create(
        model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    assert result.choices[0].message.content == "ok: hi"
    assert upstream.chat_requests()[-1]["headers"]["authorization"] == "Bearer sk-operator-secret"
    assert [s.tenant for s in guarded.app[LEDGER].sessions()] == ["team-a"]
    models = await sdk(guarded, "sk-team-a").models.list()
    assert models.data


async def test_client_keys_off_is_an_explicit_opt_out(start_gateway, upstream):
    gw = await start_gateway(upstream={"api_key": "sk-operator-secret"}, server={"client_keys": "off"})
    result = await sdk(gw, "anything").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    assert result.choices[0].message.content == "ok: hi"


async def test_client_keys_required_without_an_upstream_key(start_gateway, upstream):
    gw = await start_gateway(server={"client_keys": "required"}, tenants={"team-a": "sk-team-a"})
    with pytest.raises(openai.AuthenticationError):
        await sdk(gw, "sk-someone").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    result = await sdk(gw, "sk-team-a").chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    assert result.choices[0].message.content == "ok: hi"
    # Forwarding the client's own key: the listed key goes upstream as it came.
    assert upstream.chat_requests()[-1]["headers"]["authorization"] == "Bearer sk-team-a"
