"""Upstream faults through the real gateway, with the official openai SDK as the client.

A purpose-built fake upstream (aiohttp, port 0) misbehaves in one way per model name: an error
status, a rate limit, a reset or a stall before the first byte or in the middle of a stream,
malformed SSE, a body that says JSON and is not. Each case is run streaming and not, and must
give the client either the upstream's own status, body and headers (faithfully relayed) or, once
a stream has started, an OpenAI-format error event and the end of the stream: never a hang.
Every case also checks what the upstream received (exactly one call: no retry storm) and that an
unfinished answer is not stored in the ledger as if it were complete.

The gateway runs with small timeouts (``upstream.*timeout_s`` settings; whichever of the
first-byte / idle names exist in this version are set too) and the SDK client's own timeout is
several times larger, so "the gateway gave up" and "the client hung" cannot be confused.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from gateway.keys import LEDGER
from gateway.settings import UpstreamSettings

GATEWAY_TIMEOUT_S = 1.0
CLIENT_TIMEOUT_S = 8.0
STALL_S = 30.0
RECEIVED: web.AppKey[list[dict]] = web.AppKey("fault_received", list)
ERROR_MARKER = "the-upstream-said-so"


def _chunk(content: str | None = None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    event = {"id": "chatcmpl-fault", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _completion(content: str) -> dict:
    return {"id": "chatcmpl-fault", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


async def _sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def fault_upstream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    request.app[RECEIVED].append({"model": body.get("model"), "stream": bool(body.get("stream")),
                                  "headers": dict(request.headers)})
    fault, stream = body["model"], bool(body.get("stream"))
    if fault.startswith("recall-"):
        return await recall_fault(request, body, fault, stream)
    if fault.startswith("status-"):
        status = int(fault.removeprefix("status-"))
        envelope = {"error": {"message": f"{ERROR_MARKER} {status}", "type": "server_error", "param": None, "code": f"c{status}"}}
        return web.json_response(envelope, status=status, headers={"x-upstream-marker": "yes"})
    if fault == "rate-limited":
        envelope = {"error": {"message": f"{ERROR_MARKER} slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
        return web.json_response(envelope, status=429, headers={
            "retry-after": "7", "retry-after-ms": "7000", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7s"})
    if fault == "ok":
        if not stream:
            return web.json_response(_completion("fine"))
        response = await _sse(request)
        for piece in (_chunk(role=True, content=""), _chunk("fine"), _chunk(finish="stop"), b"data: [DONE]\n\n"):
            await response.write(piece)
        return response
    if fault == "stall-first-byte":
        await asyncio.sleep(STALL_S)
        return web.json_response(_completion("too late"))
    if fault in ("reset-mid-stream", "stall-mid-stream"):
        if stream:
            response = await _sse(request)
            await response.write(_chunk(role=True, content="partial "))
            await response.write(_chunk("answer"))
        else:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = 4096
            await response.prepare(request)
            await response.write(b'{"id": "chatcmpl-fault", "choices": [')
        await asyncio.sleep(0.05)
        if fault == "reset-mid-stream":
            request.transport.abort()
            return response
        await asyncio.sleep(STALL_S)
        return response
    if fault == "malformed-sse":
        response = await _sse(request)
        for piece in (_chunk(role=True, content="half "), b"data: {not json at all\n\n", b"data: {\"choices\": 5}\n\n",
                      b"event: weird\nid: 3\n\n", b"\xff\xfe garbage without a blank line", _chunk("more")):
            await response.write(piece)
        await response.write_eof()
        return response
    if fault == "eof-without-finish":
        response = await _sse(request)
        for piece in (_chunk(role=True, content=""), _chunk("cut short")):
            await response.write(piece)
        await response.write_eof()
        return response
    if fault == "huge-sse-event":  # one 16 MB event, arriving in 64 KB pieces
        response = await _sse(request)
        event = _chunk(role=True, content="x" * (16 << 20))
        for start in range(0, len(event), 1 << 16):
            await response.write(event[start:start + (1 << 16)])
            await asyncio.sleep(0.002)  # separate reads at the gateway, as from a real network
        await response.write(_chunk(finish="stop") + b"data: [DONE]\n\n")
        return response
    if fault == "html-as-json":
        return web.Response(status=200, body=b"<html><body>502 Bad Gateway</body></html>", content_type="application/json")
    if fault == "json-wrong-shape":
        return web.json_response({"unexpected": ["not", "a", "completion"]})
    if fault == "json-as-sse":  # asked to stream, answers a plain JSON completion
        return web.json_response(_completion("not streamed"))
    raise web.HTTPNotFound()


async def recall_fault(request: web.Request, body: dict, fault: str, stream: bool) -> web.StreamResponse:
    """A model that asks the gateway's recall tool first, then fails on the round after it."""
    if request.headers.get("x-palimpsest-purpose") == "summary":
        return web.json_response({"error": {"message": "no summaries here", "type": "server_error", "param": None, "code": None}}, status=503)
    search = next((t["function"]["name"] for t in body.get("tools") or () if "session_search" in t["function"]["name"]), None)
    last = body["messages"][-1]
    if last.get("role") == "user" and search is not None:
        call = {"id": "call_recall_1", "type": "function", "function": {"name": search, "arguments": '{"query": "deploy id"}'}}
        if not stream:
            return web.json_response({"id": "chatcmpl-r", "object": "chat.completion", "created": 1, "model": fault,
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                                                   "finish_reason": "tool_calls"}]})
        response = await _sse(request)
        event = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": fault,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, **call}]}, "finish_reason": None}]}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
        await response.write(_chunk(finish="tool_calls"))
        await response.write(b"data: [DONE]\n\n")
        return response
    if fault == "recall-500":
        return web.json_response({"error": {"message": f"{ERROR_MARKER} round 2", "type": "server_error", "param": None, "code": "c500"}}, status=500)
    # recall-reset: the second round starts answering, then the connection drops
    response = await _sse(request)
    await response.write(_chunk(role=True, content="partial "))
    await asyncio.sleep(0.05)
    request.transport.abort()
    return response


async def passthrough_fault(request: web.Request) -> web.StreamResponse:
    """Other routes: a body cut by a reset, or stalled, after the response started."""
    request.app[RECEIVED].append({"model": request.match_info["fault"], "stream": False, "headers": dict(request.headers)})
    fault = request.match_info["fault"]
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    if fault == "length":
        response.content_length = 1 << 20
    await response.prepare(request)
    await response.write(b"x" * 1000)
    await asyncio.sleep(0.05)
    if fault in ("reset", "length"):
        request.transport.abort()
        return response
    await asyncio.sleep(STALL_S)
    return response


@pytest.fixture
async def fault_url():
    app = web.Application()
    app[RECEIVED] = []
    app.router.add_post("/v1/chat/completions", fault_upstream)
    app.router.add_get("/v1/files/{fault}", passthrough_fault)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    fault_url.received = app[RECEIVED]
    yield url, app[RECEIVED]
    await runner.cleanup()


def _timeouts(seconds: float) -> dict[str, float]:
    """Every upstream timeout setting of this version that bounds waiting for bytes."""
    names = ("read_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "stream_idle_timeout_s")
    return {name: seconds for name in names if name in UpstreamSettings.model_fields}


@pytest.fixture
async def gw(start_gateway, fault_url):
    url, _ = fault_url
    return await start_gateway(upstream={"base_url": url, **_timeouts(GATEWAY_TIMEOUT_S)})


def sdk(gateway, session: str = "faults", timeout: float = CLIENT_TIMEOUT_S) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-fault-test", max_retries=0,
                              timeout=timeout, default_headers={"X-Session-Id": session})


MESSAGES = [{"role": "user", "content": "hello upstream"}]


async def _call(gateway, model: str, stream: bool, session: str = "faults") -> tuple[Any, float, list]:
    """Run one completion; returns (result or exception, seconds, stream chunks seen)."""
    client = sdk(gateway, session)
    started = time.perf_counter()
    chunks: list = []
    try:
        if stream:
            result = await client.chat.completions.create(model=model, messages=MESSAGES, stream=True)
            async for chunk in result:
                chunks.append(chunk)
        else:
            result = await client.chat.completions.create(model=model, messages=MESSAGES)
    except Exception as exc:  # noqa: BLE001 - the test inspects which one
        result = exc
    finally:
        await client.close()
    return result, time.perf_counter() - started, chunks


def _answers_in_ledger(gateway) -> list[dict]:
    ledger = gateway.app[LEDGER]
    out = []
    for record in ledger.sessions():
        out += [e.message for e in ledger.since(record.key, -1) if e.role == "assistant"]
    return out


# -- statuses the upstream chose: relayed faithfully ------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("status,exc", [(500, openai.InternalServerError), (502, openai.InternalServerError),
                                        (503, openai.InternalServerError)])
async def test_upstream_5xx_status_and_body_relayed(gw, fault_url, status, exc, stream):
    result, _, _ = await _call(gw, f"status-{status}", stream)
    assert isinstance(result, exc), result
    assert result.status_code == status
    assert result.body["message"] == f"{ERROR_MARKER} {status}"  # the upstream's own envelope
    assert result.body["code"] == f"c{status}"
    assert result.response.headers.get("x-upstream-marker") == "yes"
    assert len(fault_url[1]) == 1  # one upstream call: the gateway does not retry on the client's behalf


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_429_with_retry_after_relayed(gw, fault_url, stream):
    result, _, _ = await _call(gw, "rate-limited", stream)
    assert isinstance(result, openai.RateLimitError), result
    headers = result.response.headers
    assert headers.get("retry-after") == "7"
    assert headers.get("retry-after-ms") == "7000"
    assert headers.get("x-ratelimit-remaining-requests") == "0"
    assert result.body["code"] == "rate_limit_exceeded"
    assert len(fault_url[1]) == 1


# -- the upstream cannot be reached or does not answer -----------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_connection_refused_is_a_502_envelope(start_gateway, stream):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gateway = await start_gateway(upstream={"base_url": f"http://127.0.0.1:{port}/v1", **_timeouts(GATEWAY_TIMEOUT_S)})
    result, elapsed, _ = await _call(gateway, "ok", stream)
    assert isinstance(result, openai.APIStatusError), result
    assert result.status_code == 502
    assert result.body["type"] == "upstream_error" and result.body["code"] == "upstream_unreachable"
    assert elapsed < CLIENT_TIMEOUT_S


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_stall_before_first_byte_is_a_504_within_the_timeout(gw, fault_url, stream):
    result, elapsed, _ = await _call(gw, "stall-first-byte", stream)
    assert isinstance(result, openai.APIStatusError), result  # not openai.APITimeoutError: the gateway answered
    assert result.status_code == 504
    assert result.body["code"] == "upstream_timeout"
    assert elapsed < CLIENT_TIMEOUT_S
    assert len(fault_url[1]) == 1


# -- after the stream started: an error event, then the end ------------------------------------


def _assert_in_stream_error(result, elapsed: float, chunks: list) -> None:
    assert not isinstance(result, openai.APITimeoutError), f"the client hung for {elapsed:.1f} s"
    assert elapsed < CLIENT_TIMEOUT_S, f"the client waited {elapsed:.1f} s"
    assert isinstance(result, openai.APIError), f"the stream ended without an error: {result!r}"
    # An OpenAI-format error event, not a broken connection (APIConnectionError has no body).
    assert isinstance(result.body, dict) and result.body.get("message"), (type(result), result.body)
    assert [c.choices[0].delta.content for c in chunks if c.choices][:1] == ["partial "]  # what came first still came


async def test_reset_mid_stream_ends_with_an_error_event(gw, fault_url):
    result, elapsed, chunks = await _call(gw, "reset-mid-stream", True)
    _assert_in_stream_error(result, elapsed, chunks)
    assert not any("partial" in str(m.get("content")) for m in _answers_in_ledger(gw))  # not stored as complete
    assert len(fault_url[1]) == 1


async def test_stall_mid_stream_ends_with_an_error_event_within_the_timeout(gw, fault_url):
    result, elapsed, chunks = await _call(gw, "stall-mid-stream", True)
    _assert_in_stream_error(result, elapsed, chunks)
    assert result.body.get("code") in ("upstream_timeout", "upstream_incomplete"), result.body
    assert not any("partial" in str(m.get("content")) for m in _answers_in_ledger(gw))


@pytest.mark.parametrize("fault", ["reset-mid-stream", "stall-mid-stream"])
async def test_json_body_cut_or_stalled_is_an_error_status_within_the_timeout(gw, fault_url, fault):
    """Not streaming: nothing reached the client yet, so a plain error status is possible."""
    result, elapsed, _ = await _call(gw, fault, False)
    assert isinstance(result, openai.APIStatusError), result
    assert result.status_code in (502, 504)
    assert result.body["type"] == "upstream_error"
    assert elapsed < CLIENT_TIMEOUT_S


async def test_gateway_still_serves_after_a_mid_stream_failure(gw, fault_url):
    await _call(gw, "reset-mid-stream", True)
    result, _, chunks = await _call(gw, "ok", True)
    assert not isinstance(result, Exception), result
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "fine"


# -- what the upstream sent is not what it claims ----------------------------------------------


async def test_malformed_sse_ends_without_a_hang_and_is_not_stored_complete(gw, fault_url):
    result, elapsed, chunks = await _call(gw, "malformed-sse", True)
    assert elapsed < CLIENT_TIMEOUT_S and not isinstance(result, openai.APITimeoutError)
    assert not any(c.choices and c.choices[0].finish_reason == "stop" for c in chunks)  # never invented
    assert not any("half" in str(m.get("content")) for m in _answers_in_ledger(gw))


async def test_eof_without_finish_reason_is_not_reported_or_stored_as_stop(gw, fault_url):
    result, elapsed, chunks = await _call(gw, "eof-without-finish", True)
    assert elapsed < CLIENT_TIMEOUT_S and not isinstance(result, openai.APITimeoutError)
    assert not any(c.choices and c.choices[0].finish_reason == "stop" for c in chunks)
    assert isinstance(result, openai.APIError), "an upstream EOF without finish_reason ended like a complete answer"
    assert not any("cut short" in str(m.get("content")) for m in _answers_in_ledger(gw))


@pytest.mark.parametrize("fault", ["html-as-json", "json-wrong-shape"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_body_that_is_not_what_it_claims(gw, fault_url, fault, stream):
    """Relayed as it came (the client's SDK then fails to parse it) or refused as a 502: either
    way an error reaches the client in time, and nothing is stored as an answer."""
    result, elapsed, _ = await _call(gw, fault, stream)
    assert elapsed < CLIENT_TIMEOUT_S and not isinstance(result, openai.APITimeoutError)
    if isinstance(result, openai.APIStatusError):
        assert result.status_code == 502, result
    else:
        # Relayed: the SDK could not make a completion of it.
        assert isinstance(result, Exception) or not getattr(result, "choices", None), result
    assert _answers_in_ledger(gw) == []
    assert len(fault_url[1]) == 1


async def test_plain_json_answer_to_a_stream_request_is_relayed(gw, fault_url):
    """Some providers ignore stream=true; the gateway relays what came (status, type, body)."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.base_url}/chat/completions", json={"model": "json-as-sse", "messages": MESSAGES, "stream": True},
                             headers={"X-Session-Id": "faults"}, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as r:
            assert r.status == 200
            assert r.content_type == "application/json"
            assert (await r.json())["choices"][0]["message"]["content"] == "not streamed"


# -- the client goes away ----------------------------------------------------------------------


async def test_client_gone_mid_stream_cancels_the_upstream_call_and_stores_nothing(gateway, upstream):
    """The puppet notices when the gateway drops its side of a stream; the gateway must drop it
    as soon as the client is gone (not keep paying for tokens nobody reads), record no answer,
    and serve the next request."""
    import aiohttp

    body = {"model": "fake-32k", "stream": True, "messages": [{"role": "user", "content": "long one [[stall 5]]"}]}
    async with aiohttp.ClientSession() as http:
        response = await http.post(f"{gateway.base_url}/chat/completions", json=body, headers={"X-Session-Id": "gone"})
        assert response.status == 200
        await response.content.readany()  # the first chunk came
        response.close()  # the client goes away
    started = time.monotonic()
    while not upstream.state.disconnected and time.monotonic() - started < 4:
        await asyncio.sleep(0.05)
    assert upstream.state.disconnected, "the upstream stream was left running after the client left"
    assert not any("long one" in str(m.get("content")) for m in _answers_in_ledger(gateway))
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-x", max_retries=0, timeout=CLIENT_TIMEOUT_S,
                                default_headers={"X-Session-Id": "gone"})
    try:
        answer = await client.chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "still there?"}])
    finally:
        await client.close()
    assert answer.choices[0].message.content == "ok: still there?"


# -- a later recall round fails ------------------------------------------------------------------

RECALL_WINDOW = 8_000
# The first search of a process opens the recall index (LanceDB, WordLlama): seconds, not a hang.
RECALL_CLIENT_TIMEOUT_S = 30.0


def _long_session() -> list[dict]:
    messages: list[dict] = []
    for r in range(24):
        messages += [{"role": "user", "content": f"step {r}: note DEP-{r:05d} and read the logs"},
                     {"role": "assistant", "content": "log: " + " ".join(f"entry-{r}-{k} ok" for k in range(150))}]
    return messages + [{"role": "user", "content": "what was the first deploy id?"}]


@pytest.fixture
async def recall_gw(start_gateway, fault_url):
    url, _ = fault_url
    models = {name: {"context_window": RECALL_WINDOW} for name in ("recall-500", "recall-reset")}
    return await start_gateway(upstream={"base_url": url, **_timeouts(GATEWAY_TIMEOUT_S)}, models=models)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_recall_round_two_error_status_reaches_the_client(recall_gw, fault_url, stream):
    client = sdk(recall_gw, "recall-faults", RECALL_CLIENT_TIMEOUT_S)
    started = time.perf_counter()
    try:
        with pytest.raises(openai.APIError) as info:
            result = await client.chat.completions.create(model="recall-500", messages=_long_session(), stream=stream)
            if stream:
                async for _ in result:
                    pass
    finally:
        await client.close()
    assert time.perf_counter() - started < RECALL_CLIENT_TIMEOUT_S
    rounds = [r for r in fault_url[1] if r["model"] == "recall-500" and r["headers"].get("x-palimpsest-purpose") != "summary"]
    assert len(rounds) == 2, "the recall tool was not offered (history not hidden?) or rounds were retried"
    error = info.value
    if isinstance(error, openai.APIStatusError):  # before the stream started: the upstream's status and body
        assert error.status_code == 500 and error.body["message"] == f"{ERROR_MARKER} round 2"
    else:  # after it started: an error event
        assert isinstance(error.body, dict) and error.body.get("message"), error


async def test_recall_round_two_reset_ends_the_stream_with_an_error_event(recall_gw, fault_url):
    client = sdk(recall_gw, "recall-reset", RECALL_CLIENT_TIMEOUT_S)
    started = time.perf_counter()
    try:
        with pytest.raises(openai.APIError) as info:
            result = await client.chat.completions.create(model="recall-reset", messages=_long_session(), stream=True)
            async for _ in result:
                pass
    finally:
        await client.close()
    assert time.perf_counter() - started < RECALL_CLIENT_TIMEOUT_S
    assert not isinstance(info.value, openai.APITimeoutError)
    assert isinstance(info.value.body, dict) and info.value.body.get("message"), type(info.value)
    assert not any("partial" in str(m.get("content")) for m in _answers_in_ledger(recall_gw))


async def test_one_huge_sse_event_does_not_freeze_the_gateway(gw, fault_url):
    """An upstream event split over many reads (a 16 MB delta, or a malformed stream with no
    blank line) must cost the gateway linear work: /healthz keeps answering while it streams."""
    import aiohttp

    worst = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        async with aiohttp.ClientSession() as http:
            while not done.is_set():
                t0 = time.perf_counter()
                async with http.get(gw.base_url.removesuffix("/v1") + "/healthz") as r:
                    assert r.status == 200
                worst = max(worst, time.perf_counter() - t0)
                await asyncio.sleep(0.1)

    prober = asyncio.create_task(probe())
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.base_url}/chat/completions", json={"model": "huge-sse-event", "messages": MESSAGES, "stream": True},
                                 headers={"X-Session-Id": "huge"}, timeout=aiohttp.ClientTimeout(total=120)) as r:
                payload = await r.read()
    finally:
        done.set()
        await prober
    assert payload.rstrip().endswith(b"data: [DONE]") and len(payload) > 16 << 20
    assert worst < 1.0, f"/healthz took {worst:.1f} s while one big SSE event streamed through"


# -- pass-through routes -----------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["reset", "length", "stall"])
async def test_passthrough_body_cut_or_stalled_is_an_error_not_a_hang(gw, fault_url, fault):
    """A relayed body that breaks after it started cannot get an error status any more: the
    client must see the body end abnormally (connection closed, short body), in time."""
    import aiohttp

    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            async with http.get(f"{gw.base_url}/files/{fault}", timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as r:
                assert r.status == 200
                await r.read()
    assert time.perf_counter() - started < CLIENT_TIMEOUT_S
