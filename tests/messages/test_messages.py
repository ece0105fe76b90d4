"""Anthropic Messages through the gateway, with the official anthropic SDK against the strict
simulated /v1/messages: JSON and streams, a long thinking tool loop on a 32k model that
compacts, recall resolved in JSON and streams, count_tokens, identity and errors."""

from __future__ import annotations

import anthropic
import orjson
import pytest

from gateway.messages.cache_breakpoints import count_breakpoints
from tests.support.agent import settle

BETA = "claude-code-20250219,interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07"
BASH = {"name": "Bash", "description": "Executes a bash command and returns its output.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
SYSTEM = [{"type": "text", "text": "You are a coding agent."},
          {"type": "text", "text": "Work in the repository; be terse.", "cache_control": {"type": "ephemeral"}}]
THINKING = {"type": "enabled", "budget_tokens": 1024}
ECONOMY = {"profile": "economy", "summary_trigger_ratio": 0.3}
# The client's own server-side edits (tool-result and thinking clearing) go upstream as it sent them.
EDITS = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"},
                   {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100_000}}]}


def client_for(gw, key: str = "sk-ant-client") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.root, api_key=key, max_retries=0, timeout=60)


def headers(session: str) -> dict[str, str]:
    return {"X-Claude-Code-Session-Id": session, "anthropic-beta": BETA}


def messages_requests(upstream) -> list[dict]:
    return [r["json"] for r in upstream.received
            if r["path"].split("?")[0].endswith("/messages") and r.get("json")
            and r["headers"].get("x-palimpsest-purpose") != "summary"]


def summary_requests(upstream) -> list[dict]:
    return [r for r in upstream.received if r["headers"].get("x-palimpsest-purpose") == "summary"]


def one_branch(gw, session_id: str, history: list[dict]) -> None:
    """The ledger holds the conversation once, on one branch: every answer the gateway recorded
    hashes as the client sends it back (thinking, signature and tool_use included)."""
    from gateway.keys import LEDGER

    ledger = gw.app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == session_id)
    assert len(ledger.heads(record.key)) == 1
    events = ledger.since(record.key, -1)
    kinds = [e.message["role"] for e in events if e.kind != "side"]
    # The client's history: a user task, then per step an assistant item and a tool item (the
    # newest result was never sent).
    assert kinds == (["user"] + ["assistant", "tool"] * ((len(history) - 1) // 2))[:-1], kinds[:6]


def step_output(step: int, tokens: int = 1800) -> str:
    """A tool result of about `tokens` tokens whose last line scripts the next call."""
    filler = " ".join(f"line{step}-{i} build ok module_{step}_{i}.py passed" for i in range(tokens // 12))
    fact = f"checkpoint-{step}: the artifact for step {step} is at /srv/out/step{step}.bin"
    return f"{fact}\n{filler}\n[[call Bash {{\"command\": \"step {step + 1}\"}}]]"


def blocks_of(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


async def run_loop(client, session: str, steps: int, *, stream: bool = False, model: str = "fake-32k"):
    """A Claude-Code-like agent loop: one task, then a Bash call per step whose result scripts
    the next. Returns the history as the client keeps it and every answer."""
    history = [{"role": "user", "content": [{"type": "text", "text": "Run the chain. [[call Bash {\"command\": \"step 1\"}]]"}]}]
    answers = []
    for step in range(1, steps + 1):
        kw = dict(model=model, max_tokens=2048, system=SYSTEM, tools=[BASH], messages=history, thinking=THINKING,
                  extra_headers=headers(session), extra_body={"context_management": EDITS})
        if stream:
            async with client.messages.stream(**kw) as s:
                message = await s.get_final_message()
        else:
            message = await client.messages.create(**kw)
        answers.append(message)
        history.append({"role": "assistant", "content": blocks_of(message)})
        calls = [b for b in message.content if b.type == "tool_use"]
        assert calls, message
        # Claude Code moves its own cache marker to the newest tool result every turn.
        for earlier in history[:-1]:
            for block in earlier["content"] if isinstance(earlier["content"], list) else ():
                block.pop("cache_control", None)
        history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": calls[0].id, "content": step_output(step),
             "cache_control": {"type": "ephemeral"}}]})
    return history, answers


async def test_json_and_stream_through_the_sdk(upstream, start_gateway):
    gw = await start_gateway()
    client = client_for(gw)
    message = await client.messages.create(model="fake-32k", max_tokens=256, messages=[{"role": "user", "content": "hello"}],
                                           extra_headers=headers("s-basic"))
    assert message.type == "message" and message.content[0].type == "text"
    async with client.messages.stream(model="fake-32k", max_tokens=256, extra_headers=headers("s-basic"),
                                      messages=[{"role": "user", "content": "hello"},
                                                {"role": "assistant", "content": message.content[0].text},
                                                {"role": "user", "content": "again"}]) as stream:
        final = await stream.get_final_message()
    assert final.content[0].text.startswith("ok: again")
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    sent = messages_requests(upstream)
    assert len(sent) == 2 and sent[1]["stream"] is True
    assert all(r["path"].startswith("/v1/messages") for r in upstream.received if r.get("json"))


@pytest.mark.parametrize("upstream_format", ["openai", "anthropic"])
async def test_long_thinking_tool_loop_on_32k_compacts_and_is_accepted(upstream, start_gateway, upstream_format):
    # Cached reads at half price: the loop's piled-up placeholders are worth a summary (at 0.1 the
    # cost model settles over them instead, policies/cost.settle_size), so the summary path runs.
    gw = await start_gateway(upstream={"format": upstream_format}, policy={**ECONOMY, "cached_input_rate": 0.5})
    client = client_for(gw)
    history, answers = await run_loop(client, "s-loop", 40)
    await settle(gw)
    one_branch(gw, "s-loop", history)
    sent = messages_requests(upstream)
    assert len(sent) == 40  # every step answered, none rejected (the simulator is strict)
    client_tokens = sum(len(orjson.dumps(m)) for m in history)
    last = orjson.dumps(sent[-1]).decode()
    assert len(last) < client_tokens / 2  # the view is a fraction of the client's history
    assert "session_load" in last  # placeholders name the load tool
    summaries = summary_requests(upstream)
    assert summaries, "no summary job ran"
    wanted = "/v1/messages" if upstream_format == "anthropic" else "/v1/chat/completions"
    # A cache fork of the view speaks the view's format; a transcript, the upstream's.
    forks = [r for r in summaries if (r["json"] or {}).get("tool_choice") == {"type": "none"}]
    assert forks and {r["path"] for r in forks} == {"/v1/messages"}
    assert {r["path"] for r in summaries if r not in forks} <= {wanted}
    assert any("<session_summary>" in b["text"] for b in sent[-1]["system"] if isinstance(b, dict))
    for body in sent:
        assert body["context_management"] == EDITS
        assert count_breakpoints(body) <= 4
        roles = [m["role"] for m in body["messages"] if m["role"] != "system"]
        assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))
    # The client's own thinking blocks went upstream byte-exact with their signatures.
    newest_thinking = history[-2]["content"][0]
    assert newest_thinking["type"] == "thinking"
    assert any(m["role"] == "assistant" and m["content"][0] == newest_thinking for m in sent[-1]["messages"])
    # The client's system blocks lead the system prompt as sent; the summary follows them.
    assert [b["text"] for b in sent[-1]["system"][:2]] == [b["text"] for b in SYSTEM]


async def test_stream_loop_compacts_and_recall_is_resolved_in_the_stream(upstream, start_gateway):
    gw = await start_gateway(policy=ECONOMY)
    client = client_for(gw)
    history, _ = await run_loop(client, "s-recall", 30, stream=True)
    await settle(gw)
    one_branch(gw, "s-recall", history)
    history.append({"role": "assistant", "content": [{"type": "text", "text": "Chain done."}]})
    history[-2]["content"][0]["content"] = step_output(30).rsplit("\n", 1)[0]  # no further call
    history.append({"role": "user", "content": "RECALL: where is the artifact for step 3?"})
    events = []
    async with client.messages.stream(model="fake-32k", max_tokens=2048, system=SYSTEM, tools=[BASH],
                                      messages=history, extra_headers=headers("s-recall")) as stream:
        async for event in stream:
            events.append(event)
        final = await stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    assert "/srv/out/step3.bin" in text
    assert all(b.type != "tool_use" for b in final.content)
    starts = [e.index for e in events if e.type == "content_block_start"]
    assert starts == list(range(len(starts)))  # renumbered, gapless
    sent = messages_requests(upstream)
    assert sum(1 for b in sent[-3:] if any(t["name"] == "session_search" for t in b.get("tools") or ())) >= 1
    assert final.usage.output_tokens > 0


async def test_recall_is_resolved_in_json(upstream, start_gateway):
    gw = await start_gateway(policy=ECONOMY)
    client = client_for(gw)
    history, _ = await run_loop(client, "s-recall-json", 30)
    await settle(gw)
    history[-1]["content"][0]["content"] = step_output(30).rsplit("\n", 1)[0]
    history.append({"role": "assistant", "content": [{"type": "text", "text": "Chain done."}]})
    history.append({"role": "user", "content": "RECALL: where is the artifact for step 2?"})
    before = len(messages_requests(upstream))
    message = await client.messages.create(model="fake-32k", max_tokens=2048, system=SYSTEM, tools=[BASH],
                                           messages=history, extra_headers=headers("s-recall-json"))
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "/srv/out/step2.bin" in text and all(b.type != "tool_use" for b in message.content)
    assert message.stop_reason == "end_turn"
    rounds = messages_requests(upstream)[before:]
    assert len(rounds) >= 2  # the gateway called again with the recall results
    assert message.usage.output_tokens >= len(rounds)


async def test_count_tokens_answers_for_the_compacted_view(upstream, start_gateway):
    gw = await start_gateway()
    client = client_for(gw)
    history, _ = await run_loop(client, "s-count", 30)
    await settle(gw)
    counted = await client.messages.count_tokens(model="fake-32k", system=SYSTEM, tools=[BASH], messages=history,
                                                 extra_headers=headers("s-count"))
    direct = await client.messages.count_tokens(model="fake-32k", system=SYSTEM, tools=[BASH], messages=history,
                                                extra_headers={"anthropic-beta": BETA})
    assert counted.input_tokens < 32_000 < direct.input_tokens
    assert not any(r["path"].endswith("/count_tokens") for r in upstream.received)


async def test_x_api_key_is_a_client_key_and_errors_use_anthropics_envelope(upstream, start_gateway):
    gw = await start_gateway(server={"client_keys": "required"}, tenants={"team": "sk-ant-team"})
    ok = await client_for(gw, "sk-ant-team").messages.create(
        model="fake-32k", max_tokens=64, messages=[{"role": "user", "content": "hi"}], extra_headers=headers("s-id"))
    assert ok.content[0].type == "text"
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await client_for(gw, "sk-ant-other").messages.create(
            model="fake-32k", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["type"] == "error" and denied.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client_for(gw, "sk-ant-team").messages.create(model="fake-32k", max_tokens=64, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"


async def test_overloaded_is_passed_through_as_the_upstream_sent_it(upstream, start_gateway):
    gw = await start_gateway()
    upstream.state.failures.append(529)
    with pytest.raises(anthropic.APIStatusError) as failed:
        await client_for(gw).messages.create(model="fake-32k", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                                             extra_headers=headers("s-529"))
    assert failed.value.status_code == 529 and failed.value.body["error"]["type"] == "overloaded_error"


async def post_raw(gw, key: str, session: str) -> tuple[int, dict]:
    """A request that carries its key in x-api-key only, as Claude Code sends it."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(gw.root + "/v1/messages?beta=true", json={
                "model": "fake-32k", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-api-key": key, "anthropic-version": "2023-06-01", **headers(session)}) as resp:
            return resp.status, await resp.json()


async def test_x_api_key_is_a_credential_and_the_operator_key_goes_upstream_in_it(upstream, start_gateway):
    gw = await start_gateway(upstream={"api_key": "sk-operator"}, tenants={"team": "sk-ant-team"})
    status, answer = await post_raw(gw, "sk-ant-team", "s-key")
    assert status == 200 and answer["type"] == "message"
    sent = upstream.received[-1]
    assert sent["path"] == "/v1/messages" and sent["headers"].get("x-api-key") == "sk-operator"
    assert "authorization" not in sent["headers"]
    status, denied = await post_raw(gw, "sk-ant-nobody", "s-key")
    assert status == 401 and denied["error"]["type"] == "authentication_error"
    plain = await start_gateway()
    status, _ = await post_raw(plain, "sk-ant-own", "s-key2")
    assert status == 200 and upstream.received[-1]["headers"].get("x-api-key") == "sk-ant-own"


async def test_mid_conversation_system_messages_stay_in_place_through_the_gateway(upstream, start_gateway):
    gw = await start_gateway()
    history = [{"role": "user", "content": "first"},
               {"role": "system", "content": "Available agent types: claude, Explore."},
               {"role": "assistant", "content": "ok"},
               {"role": "user", "content": "second"}]
    message = await client_for(gw).messages.create(model="fake-32k", max_tokens=64, messages=history,
                                                   extra_headers=headers("s-mid"))
    assert message.content[0].text.startswith("ok: second")
    assert messages_requests(upstream)[-1]["messages"] == history


async def test_windows_of_an_anthropic_upstream_and_of_well_known_claude_models(upstream, start_gateway):
    from gateway.keys import UPSTREAM
    from gateway.pipeline.windows import Windows

    gw = await start_gateway(upstream={"format": "anthropic", "api_key": "sk-operator"})
    windows = Windows({}, gw.app[UPSTREAM])
    assert await windows.window("fake-32k") == 32_000  # the models endpoint, asked the Anthropic way
    asked = [r for r in upstream.received if r["path"] == "/v1/models"][-1]["headers"]
    assert asked.get("x-api-key") == "sk-operator" and asked.get("anthropic-version")
    assert await windows.window("claude-sonnet-4-5-20250929") == 200_000  # the table of well-known models


async def test_a_stream_that_stalls_ends_with_anthropics_error_event(upstream, start_gateway):
    import aiohttp

    gw = await start_gateway(upstream={"idle_timeout_s": 0.3})
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.root + "/v1/messages", json={
                "model": "fake-32k", "max_tokens": 64, "stream": True,
                "messages": [{"role": "user", "content": "hi [[stall 2]]"}]},
                headers={"x-api-key": "k", "anthropic-version": "2023-06-01", **headers("s-stall")}) as resp:
            text = (await resp.read()).decode()
    assert text.startswith("event: message_start")
    assert "event: error\ndata: " in text and '"type":"timeout_error"' in text
    assert "message_stop" not in text
    with pytest.raises(anthropic.APIStatusError):
        async with client_for(gw).messages.stream(model="fake-32k", max_tokens=64, extra_headers=headers("s-stall2"),
                                                  messages=[{"role": "user", "content": "hi [[stall 2]]"}]) as s:
            await s.get_final_message()


async def test_a_body_over_the_limit_is_413_in_anthropics_envelope(upstream, start_gateway):
    gw = await start_gateway(server={"max_body_mb": 0.01})
    with pytest.raises(anthropic.APIStatusError) as failed:
        await client_for(gw).messages.create(model="fake-32k", max_tokens=64, extra_headers=headers("s-413"),
                                             messages=[{"role": "user", "content": "x" * 20_000}])
    assert failed.value.status_code == 413
    assert failed.value.body["type"] == "error" and failed.value.body["error"]["type"] == "request_too_large"
    counted = await client_for(gw).messages.count_tokens(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client_for(gw).messages.count_tokens(model="fake-32k", messages="hi")
    assert bad.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("fault", ["none", "429", "ignore"])
async def test_a_60_step_thinking_loop_under_one_user_message_survives_a_failing_summary_model(upstream, start_gateway, fault):
    """60 Bash calls under one user message, thinking replayed with its signatures, while the
    summary model works, answers 429 to every call, or ignores the required format: every step
    is answered inside the window on one branch, and nothing the client sees fails."""
    if fault == "429":
        upstream.state.summary_status = 429
    elif fault == "ignore":
        upstream.state.summary_format = "ignore"
    gw = await start_gateway(policy=ECONOMY)
    history, answers = await run_loop(client_for(gw), f"s-60-{fault}", 60)
    await settle(gw)
    one_branch(gw, f"s-60-{fault}", history)
    sent = messages_requests(upstream)
    assert len(sent) == 60 and all(a.stop_reason == "tool_use" for a in answers)
    assert summary_requests(upstream)  # the gateway did try to summarise
    last = orjson.dumps(sent[-1]).decode()
    assert len(last) < sum(len(orjson.dumps(m)) for m in history) / 2  # compacted all the same
    newest = [b for m in history[-2:-1] for b in m["content"] if b.get("type") == "thinking"]
    assert newest and newest[0]["signature"] in last  # the newest thinking block went back as signed
