"""Upstream failures after the client's stream started: an error event, never a hang.

The gateway talks to a relay (a real aiohttp app on port 0) in front of the puppet. The relay
passes every call through, except the one it is told to break: it answers that one with an
error status, resets the connection after a first chunk, stalls after it, or ends the stream
without a finish_reason. Breaking the second call of a turn hits the recall loop's second
round, after the client's stream has started. The client is the official openai SDK, with a
timeout well above the gateway's, so "the gateway told the client" and "the client gave up"
cannot be confused.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from gateway.keys import LEDGER, METRICS

GATEWAY_TIMEOUT_S = 0.5
CLIENT_TIMEOUT_S = 10.0
MODEL = "fake-8k"
TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}


@dataclass
class Relay:
    target: str  # the puppet's base URL, ending in /v1
    break_call: int = 0  # 1-based number of the chat call to break; 0: none
    fault: str = ""
    chat_calls: list[dict] = field(default_factory=list)


RELAY: web.AppKey[Relay] = web.AppKey("relay", Relay)


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {"role": "assistant", "content": content} if content is not None else {}
    event = {"id": "chatcmpl-relay", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


async def _broken(request: web.Request, fault: str, stream: bool) -> web.StreamResponse:
    if fault == "status":
        return web.json_response({"error": {"message": "overloaded", "type": "server_error", "param": None, "code": None}}, status=503)
    if not stream:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 4096
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-relay", "choices": [')
    else:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk("partial "))
    if fault == "reset":
        await asyncio.sleep(0.05)
        request.transport.abort()
    elif fault == "stall":
        await asyncio.sleep(30)
    elif fault == "eof":
        await response.write(_chunk("cut short"))
        await response.write_eof()
    return response


async def _relay(request: web.Request) -> web.StreamResponse:
    relay = request.app[RELAY]
    body = await request.read()
    is_chat = request.path.endswith("/chat/completions")
    if is_chat:
        parsed = orjson.loads(body)
        relay.chat_calls.append(parsed)
        if len(relay.chat_calls) == relay.break_call:
            return await _broken(request, relay.fault, bool(parsed.get("stream")))
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type", "x-palimpsest-purpose")}
    async with aiohttp.ClientSession() as session:
        async with session.request(request.method, relay.target + request.path.removeprefix("/v1"), data=body or None,
                                   headers=headers) as up:
            response = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@pytest.fixture
async def relay(upstream):
    app = web.Application()
    app[RELAY] = Relay(upstream.base_url)
    app.router.add_route("*", "/v1/{tail:.*}", _relay)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield app[RELAY], f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    await runner.cleanup()


@pytest.fixture
async def gw(start_gateway, relay):
    timeouts = {"first_byte_timeout_s": GATEWAY_TIMEOUT_S, "idle_timeout_s": GATEWAY_TIMEOUT_S}
    return await start_gateway(upstream={"base_url": relay[1], **timeouts})


def sdk(gateway, session: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-faults", max_retries=0, timeout=CLIENT_TIMEOUT_S,
                              default_headers={"X-Session-Id": session})


def history_that_hides(question: str) -> list[dict]:
    """An old, big tool result the view compacts to a placeholder (so recall tools are offered),
    a few small rounds, and a last user message that makes the puppet recall."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}]
    for i in range(5):
        output = ("The deploy id is DEP-4711. " if i == 0 else "") + f"line {i} of the build log. " * (900 if i == 0 else 5)
        messages += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "log"}'}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": output},
            {"role": "assistant", "content": f"done {i}"},
        ]
    return messages + [{"role": "user", "content": f"RECALL: {question}"}]


async def run(gateway, session: str, stream: bool, **extra):
    """One completion through the SDK: (result or exception, seconds, content seen, finish reasons)."""
    client = sdk(gateway, session)
    started = time.perf_counter()
    seen, finishes = [], []
    try:
        if stream:
            result = await client.chat.completions.create(model=MODEL, messages=history_that_hides("What is the deploy id?"),
                                                          tools=[TOOL], stream=True, **extra)
            async for chunk in result:
                for choice in chunk.choices:
                    seen.append(choice.delta.content or "")
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
        else:
            result = await client.chat.completions.create(model=MODEL, messages=history_that_hides("What is the deploy id?"),
                                                          tools=[TOOL], **extra)
    except Exception as exc:  # noqa: BLE001 - the tests inspect which one
        result = exc
    finally:
        await client.close()
    return result, time.perf_counter() - started, "".join(seen), finishes


def answers_in_ledger(gateway) -> list[dict]:
    """Answers the gateway recorded: assistant events that are not in what the client sent."""
    ledger = gateway.app[LEDGER]
    sent = orjson.dumps(history_that_hides("What is the deploy id?")).decode()
    events = [e for r in ledger.sessions() for e in ledger.since(r.key, -1) if e.kind == "message" and e.role == "assistant"]
    return [e.message for e in events if e.message.get("content") and e.message["content"] not in sent]


def metric(gateway, name: str, **labels) -> float:
    for family in gateway.app[METRICS].registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def recall_tool_names(body: dict) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []} & {"session_search", "session_load"}


async def test_recall_is_offered_and_resolved_without_faults(gw, relay):
    """The setup the fault tests rely on: the first call offers recall tools, the gateway
    resolves search and load itself, and the stream ends complete and is recorded."""
    result, _, content, finishes = await run(gw, "ok", stream=True)
    assert not isinstance(result, Exception), result
    calls = relay[0].chat_calls
    assert recall_tool_names(calls[0]) == {"session_search", "session_load"}
    assert len(calls) >= 2 and "DEP-4711" in content and finishes == ["stop"]
    assert all(recall_tool_names(c) for c in calls[:-1])  # every round but the answer offered recall
    assert any("DEP-4711" in str(m.get("content")) for m in answers_in_ledger(gw))


@pytest.mark.parametrize("fault,code,status", [
    ("status", "upstream_503", "502"),
    ("reset", "upstream_unreachable", "502"),
    ("stall", "upstream_timeout", "504"),
    ("eof", "upstream_incomplete", "502"),
])
async def test_second_recall_round_failing_ends_the_stream_with_an_error_event(gw, relay, fault, code, status):
    relay[0].break_call, relay[0].fault = 2, fault
    result, elapsed, content, finishes = await run(gw, f"rec-{fault}", stream=True)
    # The SDK raised on the error event: not a timeout, not a stream that looked complete.
    assert isinstance(result, openai.APIError) and not isinstance(result, openai.APITimeoutError), result
    assert elapsed < CLIENT_TIMEOUT_S / 2
    assert result.body["code"] == code and result.body["type"] == "upstream_error"
    assert "stop" not in finishes  # an unfinished answer is never reported as complete
    assert not any("cut short" in str(m.get("content")) or "partial" in str(m.get("content")) for m in answers_in_ledger(gw))
    assert len(relay[0].chat_calls) == 2  # no retry behind the client's back
    kind = {"upstream_503": "503", "upstream_timeout": "timeout"}.get(code, code.removeprefix("upstream_"))
    assert metric(gw, "palimpsest_incomplete_answers_total", kind=kind) == 1
    assert metric(gw, "palimpsest_requests_total", route="chat", status=status) == 1


async def test_stall_in_a_plain_stream_is_a_timeout_in_stream_and_in_metrics(gw, relay):
    relay[0].break_call, relay[0].fault = 1, "stall"
    client = sdk(gw, "plain-stall")
    started = time.perf_counter()
    with pytest.raises(openai.APIError) as info:
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        async for _ in stream:
            pass
    assert time.perf_counter() - started < CLIENT_TIMEOUT_S / 2
    assert info.value.body["code"] == "upstream_timeout"
    assert metric(gw, "palimpsest_upstream_errors_total", kind="timeout") == 1
    assert metric(gw, "palimpsest_upstream_errors_total", kind="unreachable") == 0
    assert metric(gw, "palimpsest_requests_total", route="chat", status="504") == 1
    assert answers_in_ledger(gw) == []


async def test_connection_is_closed_after_an_in_stream_error(gw, relay):
    relay[0].break_call, relay[0].fault = 1, "eof"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/chat/completions", json=body, headers={"X-Session-Id": "close"}) as r:
            assert r.status == 200
            text = (await r.read()).decode()
            assert r.headers.get("Connection", "").lower() != "keep-alive"
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert orjson.loads(events[-1])["error"]["code"] == "upstream_incomplete"
    assert "[DONE]" not in events  # an incomplete answer does not end like a complete one


async def test_recall_round_failing_without_stream_is_an_error_status(gw, relay):
    relay[0].break_call, relay[0].fault = 2, "reset"
    result, elapsed, _, _ = await run(gw, "rec-json", stream=False)
    assert isinstance(result, openai.APIStatusError), result
    assert result.status_code == 502 and result.body["code"] == "upstream_unreachable"
    assert elapsed < CLIENT_TIMEOUT_S / 2
    assert answers_in_ledger(gw) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_recall_rounds_upstream_status_is_counted_once(gw, relay, stream):
    relay[0].break_call, relay[0].fault = 2, "status"
    result, _, _, _ = await run(gw, f"rec-503-{stream}", stream=stream)
    assert isinstance(result, openai.APIError), result
    # In the stream the status is told as an error event; either way it is the upstream's 503.
    assert metric(gw, "palimpsest_upstream_errors_total", kind="503") == 1
    assert answers_in_ledger(gw) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_n_above_one_forwards_without_recall_and_keeps_choices_apart(gw, relay, stream):
    result, _, content, _ = await run(gw, f"many-{stream}", stream=stream, n=2)
    assert not isinstance(result, Exception), result
    calls = relay[0].chat_calls
    assert len(calls) == 1 and recall_tool_names(calls[0]) == set()
    assert calls[0]["n"] == 2 and "tool_choice" not in calls[0]
    assert "session_search" not in orjson.dumps(calls[0]["tools"]).decode()
    if not stream:
        assert [c.index for c in result.choices] == [0, 1]


async def test_passthrough_event_stream_cut_mid_way_ends_with_an_error_event(start_gateway):
    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "par", "index": 0}]}\n\n')
        await asyncio.sleep(30)
        return response

    async def download(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b"x" * 100)
        await asyncio.sleep(30)
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/files/f/content", download)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    gateway = await start_gateway(upstream={"base_url": f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
                                            "idle_timeout_s": GATEWAY_TIMEOUT_S})
    try:
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-p", max_retries=0, timeout=CLIENT_TIMEOUT_S)
        with pytest.raises(openai.APIError) as info:
            async for _ in await client.completions.create(model="m", prompt="p", stream=True):
                pass
        assert info.value.body["code"] == "upstream_timeout"
        # Not an event stream: the body is cut short, so the client sees it incomplete, in time.
        started = time.perf_counter()
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.get(gateway.base_url + "/files/f/content") as r:
                    await r.read()
        assert time.perf_counter() - started < CLIENT_TIMEOUT_S / 2
        assert metric(gateway, "palimpsest_requests_total", route="passthrough", model="none", status="504") == 2
    finally:
        await runner.cleanup()


async def test_lost_recall_audit_trail_is_logged_and_counted(gw, relay, monkeypatch, caplog):
    ledger = gw.app[LEDGER]

    def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ledger, "add_side_events", refuse)
    result, _, content, _ = await run(gw, "audit", stream=True)
    assert not isinstance(result, Exception), result
    assert "DEP-4711" in content  # the recall still answered
    rounds = len(relay[0].chat_calls) - 1  # every upstream call but the answer was a recall round
    assert rounds >= 1
    assert metric(gw, "palimpsest_store_write_errors_total", what="recall_side_events") == rounds
    records = [r for r in caplog.records if r.getMessage() == "recording recall calls failed"]
    assert len(records) == rounds and records[0].fields["error"] == "OSError"
    assert not any("DEP-4711" in r.getMessage() or "DEP-4711" in str(getattr(r, "fields", "")) for r in caplog.records)


async def test_error_escaping_a_started_response_closes_the_connection():
    """The middleware's last resort: a handler that started its response and then raised gets
    its connection closed, instead of a second response the client would wait on."""
    from gateway.http.errors import UpstreamTimeout
    from gateway.http.middleware import error_middleware
    from gateway.ops.metrics import Metrics

    async def careless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunk("partial "))
        raise UpstreamTimeout("stalled")

    app = web.Application(middlewares=[error_middleware])
    app[METRICS] = Metrics()
    app.router.add_get("/stream", careless)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as s:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.get(f"http://127.0.0.1:{runner.addresses[0][1]}/stream") as r:
                    assert r.status == 200
                    await r.read()
    finally:
        await runner.cleanup()
