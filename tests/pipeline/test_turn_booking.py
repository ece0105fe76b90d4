"""A recorded turn's bookkeeping (the summary decision, the turn log's entry) comes after the
response's last byte, yet before anything else in the process runs: the client (here in the
same event loop) never has an answer whose turn is not booked. The answer itself is committed
before the response (tests/pipeline/test_ledger_through_gateway.py)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from gateway.keys import LEDGER, SUMMARIZER, TURNS
from tests.pipeline.formats import WIRES


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", sorted(WIRES))
async def test_the_turn_is_booked_after_the_response_and_before_the_client_goes_on(gateway, upstream, monkeypatch,
                                                                                    name, stream):
    wire = WIRES[name]
    order: list[str] = []
    ledger, summarizer, turns = gateway.app[LEDGER], gateway.app[SUMMARIZER], gateway.app[TURNS]
    real_append, real_after_turn, real_add = ledger.append, summarizer.after_turn, turns.add
    real_eof = web.StreamResponse.write_eof

    def append(*a, **k):
        order.append("append")
        return real_append(*a, **k)

    def after_turn(turn, event):
        order.append("summary decision")
        return real_after_turn(turn, event)

    def add(basis):
        order.append("turn log")
        return real_add(basis)

    async def write_eof(self, *a, **k):
        ending = not self._eof_sent  # aiohttp calls it again, to no effect, once the handler returned
        done = await real_eof(self, *a, **k)
        if ending and getattr(self, "_gateway_path", None) == wire.path:
            order.append("response ended")
        return done

    async def prepare(self, request):  # marks the gateway's own responses on the format's route
        if request.app is gateway.app and request.path == wire.path:
            self._gateway_path = request.path
        return await real_prepare(self, request)

    real_prepare = web.StreamResponse.prepare
    monkeypatch.setattr(ledger, "append", append)
    monkeypatch.setattr(summarizer, "after_turn", after_turn)
    monkeypatch.setattr(turns, "add", add)
    monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
    monkeypatch.setattr(web.StreamResponse, "prepare", prepare)
    async with aiohttp.ClientSession() as http:
        history = wire.start("What is the capital of France?")
        answer = await wire.post(http, gateway.root, wire.body(history, stream=stream), session=f"booking-{name}-{stream}")
        booked_when_answered = list(order)  # nothing awaited since the client had its answer
    assert answer.status == 200, answer.body
    assert "text/event-stream" in answer.headers["content-type"] if stream else answer.body is not None
    assert answer.text  # the client got the puppet's answer
    assert booked_when_answered == ["append", "response ended", "summary decision", "turn log"]
    received = [r for r in upstream.received if r["path"].split("?")[0] == wire.path]
    assert len(received) == 1 and received[0]["json"].get("stream", False) is stream
