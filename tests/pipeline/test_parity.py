"""Every user-visible behaviour of the request path, run for each of the three wire formats
(Chat Completions, the Responses API, Anthropic Messages) through a real gateway in front of the
strict simulator: the headers, recall hidden in JSON and in streams with usage summed, the
refusals for the window and the storage quota (nothing stored), an upstream stream that fails
mid-way, tenant fences, bad input in the API's own envelope."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.keys import LEDGER
from tests.pipeline.formats import WIRES, main_requests, run_loop
from tests.pipeline.test_storage import on_a_fresh_host
from tests.support.agent import settle

ECONOMY = {"profile": "economy", "summary_trigger_ratio": 0.3}
# Summaries whenever the view passes the trigger, whatever the cost model would decide.
SUMMARIES = {**ECONOMY, "cost_model": False}

pytestmark = pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))


async def test_the_palimpsest_headers_on_a_compacted_answer(wire, upstream, start_gateway):
    gw = await start_gateway(policy=SUMMARIES)
    async with aiohttp.ClientSession() as http:
        history, answers = await run_loop(wire, http, gw.root, "s-headers", 24)
        await settle(gw)
        last = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-headers")
    assert last.status == 200
    h = last.headers
    assert h["x-palimpsest-session"] == "s-headers" and h["x-request-id"]
    assert int(h["x-palimpsest-prompt-tokens-upstream"]) < int(h["x-palimpsest-prompt-tokens-client"])
    assert h.get("x-palimpsest-checkpoint")  # the view starts from a summary
    assert int(h["x-palimpsest-cached-tokens"]) >= 0  # the provider's cache read, on every JSON answer
    sent = main_requests(upstream, wire)[-1]
    assert len(str(sent)) < len(str(wire.body(history, stream=False)))  # the compact view went up


async def test_truncated_tool_results_are_named_in_a_header(wire, upstream, start_gateway):
    gw = await start_gateway(policy={"max_result_tokens": 500})
    async with aiohttp.ClientSession() as http:
        history = wire.start("Run it. [[call Bash {\"command\": \"step 1\"}]]")
        first = await wire.post(http, gw.root, wire.body(history, stream=False, model="fake-8k"), session="s-trunc")
        wire.add_answer(history, first)
        wire.add_result(history, first.calls[0][0], "head " + "row " * 6000)  # over the window alone
        answer = await wire.post(http, gw.root, wire.body(history, stream=False, model="fake-8k"), session="s-trunc")
    assert answer.status == 200
    assert answer.headers["x-palimpsest-truncated-tool-results"] == "1"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_recall_is_resolved_by_the_gateway_and_hidden_from_the_client(wire, stream, upstream, start_gateway):
    gw = await start_gateway(policy=ECONOMY)
    async with aiohttp.ClientSession() as http:
        history, _ = await run_loop(wire, http, gw.root, "s-recall", 24)
        # The newest result ends the chain: the model answers, then the user asks back an early fact.
        reply = await wire.post(http, gw.root, wire.body(history, stream=False), session="s-recall")
        assert reply.status == 200 and not reply.calls
        wire.add_answer(history, reply)
        await settle(gw)
        wire.add_user(history, "RECALL: where is the artifact for step 2?")
        before = len(main_requests(upstream, wire))
        answer = await wire.post(http, gw.root, wire.body(history, stream=stream), session="s-recall")
    assert answer.status == 200
    assert "/srv/out/step2.bin" in answer.text
    assert not any(name.startswith("session_") for _, name in answer.calls)
    assert "session_search" not in answer.raw.decode()  # not even as an event of the stream
    rounds = main_requests(upstream, wire)[before:]
    assert len(rounds) >= 2  # the gateway called again with the recall results
    assert answer.output_tokens >= len(rounds)  # usage summed over the rounds


async def test_a_request_over_the_window_is_refused_and_stores_nothing(wire, upstream, start_gateway):
    gw = await start_gateway()
    async with aiohttp.ClientSession() as http:
        history = wire.start("word " * 40_000)
        answer = await wire.post(http, gw.root, wire.body(history, stream=False, model="fake-8k"), session="s-big")
    assert answer.status == 400
    assert wire.error_type(answer.body) == "invalid_request_error"
    assert main_requests(upstream, wire) == []
    assert gw.app[LEDGER].sessions() == []


async def test_a_tenant_over_its_storage_quota_gets_429_and_stores_nothing(wire, upstream, start_gateway, tmp_path,
                                                                          monkeypatch):
    on_a_fresh_host(monkeypatch)  # time.monotonic() below quota.REFRESH_S: the first 10 minutes after boot
    gw = await start_gateway(tenants={"small": {"key": "pk-small", "max_stored_mb": 0.01}},
                             store={"path": str(tmp_path / "data")})
    async with aiohttp.ClientSession() as http:
        first = await wire.post(http, gw.root, wire.body(wire.start("x" * 12_000), stream=False), key="pk-small",
                                session="s1")
        assert first.status == 200
        forwarded = len(main_requests(upstream, wire))
        second = await wire.post(http, gw.root, wire.body(wire.start("one more"), stream=False), key="pk-small",
                                 session="s2")
    assert second.status == 429
    wire.error_type(second.body)  # in the API's own envelope
    assert len(main_requests(upstream, wire)) == forwarded
    assert [r.session_id for r in gw.app[LEDGER].sessions("small")] == ["s1"]


async def test_a_stream_that_stalls_ends_with_the_formats_error_event_and_records_nothing(wire, upstream, start_gateway):
    gw = await start_gateway(upstream={"idle_timeout_s": 0.3})
    async with aiohttp.ClientSession() as http:
        history = wire.start("hi [[stall 2]]")
        answer = await wire.post(http, gw.root, wire.body(history, stream=True), session="s-stall")
    assert answer.status == 200  # the stream had started
    assert wire.stream_error(answer.raw) is not None
    record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "s-stall")
    assert [e.message["role"] for e in gw.app[LEDGER].since(record.key, -1)] == ["user"]  # no answer recorded


async def test_a_tenant_cannot_recall_another_tenants_session(wire, upstream, start_gateway):
    gw = await start_gateway(policy=ECONOMY, tenants={"a": "pk-a", "b": "pk-b"}, server={"client_keys": "required"})
    async with aiohttp.ClientSession() as http:
        await run_loop(wire, http, gw.root, "s-shared", 24, key="pk-a")
        await settle(gw)
        history = wire.start("RECALL: where is the artifact for step 2?")
        answer = await wire.post(http, gw.root, wire.body(history, stream=False), key="pk-b", session="s-shared")
        denied = await wire.post(http, gw.root, wire.body(history, stream=False), key="pk-nobody", session="s-shared")
    assert answer.status == 200
    assert "/srv/out/step2.bin" not in answer.raw.decode()
    assert denied.status == 401 and wire.error_type(denied.body) == "authentication_error"


@pytest.mark.parametrize("junk", [b"{not json", b"[1, 2]", b'{"model": 5}'], ids=["not-json", "not-object", "bad-model"])
async def test_bad_input_is_a_400_in_the_apis_envelope(wire, junk, upstream, start_gateway):
    gw = await start_gateway()
    async with aiohttp.ClientSession() as http:
        answer = await wire.post(http, gw.root, {}, raw=junk, session="s-bad")
    assert answer.status == 400
    assert wire.error_type(answer.body) == "invalid_request_error"
    assert main_requests(upstream, wire) == []
    assert gw.app[LEDGER].sessions() == []
