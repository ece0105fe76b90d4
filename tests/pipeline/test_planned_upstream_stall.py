"""An upstream that accepts a planned request and never sends its headers, on every wire format,
for a JSON and a streamed request, in the turn's first round and in a recall round after a
hidden search: the client gets a 504 in its API's envelope after the configured
``first_byte_timeout_s`` (a stream the recall loop had already started ends with its format's
timeout error event instead: its 200 is sent), the upstream got the request once (no retry
behind the client's back), the ledger keeps the client's messages whole and no answer, and
the identical next request is answered from a valid compacted view and recorded.

The upstream is the puppet with one hang armed (``PuppetState.hangs``), so the retry is the very
same request. The stalls in a started stream: tests/pipeline/test_planned_stream_faults.py."""

from __future__ import annotations

import time

import aiohttp
import pytest

from tests.pipeline.formats import WIRES, main_requests, run_loop, step_output
from tests.pipeline.test_planned_stream_faults import (COMPLETE, before_a_recall, compacted, ledger_path, streamed_text,
                                                       tool_names)
from tests.support.agent import settle

FIRST_BYTE_S = 2.0  # the gateway's wait: long enough that a loaded machine's normal steps never reach it
HANG_S = FIRST_BYTE_S + 3.0  # the upstream's silence: far past the gateway's wait, short enough to end with the test
STEPS = 12

pytestmark = pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))


def answered_text(wire, answer) -> str:
    return streamed_text(answer.raw) if answer.body is None else answer.text


async def stall_then_retry(wire, gw, upstream, session: str, history: list, hangs: list[float], stream: bool) -> dict:
    upstream.state.hangs.extend(hangs)
    before = len(main_requests(upstream, wire))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10 * FIRST_BYTE_S + 5)) as http:
        broken = await wire.post(http, gw.root, wire.body(history, stream=stream), session=session)
        ended = time.perf_counter()
    sent = main_requests(upstream, wire)[before:]
    # From the silent call's arrival upstream to the client's answer (a recall round's search before it not counted).
    elapsed = ended - [r for r in upstream.received if r["path"].split("?")[0] == wire.path][-1]["at"]
    held = ledger_path(gw, session)
    # A new connection: the gateway closes one after an in-stream error (too late for `Connection: close`).
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10 * FIRST_BYTE_S + 5)) as http:
        retry = await wire.post(http, gw.root, wire.body(history, stream=stream), session=session)
    return {"broken": broken, "elapsed": elapsed, "sent": sent, "held": held, "retry": retry,
            "resent": main_requests(upstream, wire)[before + len(sent):], "after": ledger_path(gw, session)}


def check(wire, upstream, run: dict, stream: bool, client_answers: int, *, started: bool = False) -> None:
    broken, held, after, retry = run["broken"], run["held"], run["after"], run["retry"]
    assert run["sent"] and all(compacted(wire, body) > 0 for body in run["sent"])  # planned: compacted views
    assert all({"session_search", "session_load"} <= tool_names(body) for body in run["sent"])
    if started:  # the recall loop's stream had started: its format's error event, never an answer that looks complete
        assert broken.status == 200 and wire.stream_error(broken.raw) is not None, broken.raw[-400:]
        assert not COMPLETE[wire.name](broken.raw)
    else:
        assert broken.status == 504, (broken.status, broken.raw[:400])
        # OpenAI's envelope with the gateway's code, Anthropic's with its timeout type.
        assert wire.error_type(broken.body) == ("timeout_error" if wire.name == "messages" else "upstream_error")
        if wire.name != "messages":
            assert wire.error_code(broken.body) == "upstream_timeout"
    # The configured wait, not the upstream's silence (whose end would have brought an answer).
    assert FIRST_BYTE_S <= run["elapsed"] < HANG_S - 0.5
    assert not upstream.state.hangs  # every armed hang was met by the broken request
    outputs = [step_output(step, last=step == STEPS) for step in range(1, STEPS + 1)]
    texts = [str(e.message.get("content")) for e in held]
    for output in outputs:
        assert sum(output in t for t in texts) == 1, "a tool result not held whole"
    assert sum(e.role == "assistant" for e in held) == client_answers and held[-1].role != "assistant"
    assert retry.status == 200, (retry.status, retry.raw[:400])
    if stream:
        assert wire.stream_error(retry.raw) is None and COMPLETE[wire.name](retry.raw)
    assert run["resent"] and all(compacted(wire, body) > 0 for body in run["resent"])
    assert after[:-1] == held and after[-1].role == "assistant"
    text = answered_text(wire, retry)
    assert text and text in str(after[-1].message.get("content"))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_planned_request_whose_upstream_never_answers_is_a_504(wire, stream, upstream, start_gateway):
    gw = await start_gateway(upstream={"first_byte_timeout_s": FIRST_BYTE_S, "idle_timeout_s": FIRST_BYTE_S})
    session = f"s-hang-{stream}"
    async with aiohttp.ClientSession() as http:
        history, answers = await run_loop(wire, http, gw.root, session, STEPS)
    run = await stall_then_retry(wire, gw, upstream, session, history, [HANG_S], stream)
    assert len(run["sent"]) == 1
    check(wire, upstream, run, stream, len(answers))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_recall_round_whose_upstream_never_answers_fails_in_time(wire, stream, upstream, start_gateway):
    """The silence in the recall loop's second round: the first answered with a hidden
    session_search call, the gateway ran the search, and the next upstream call hangs."""
    gw = await start_gateway(upstream={"first_byte_timeout_s": FIRST_BYTE_S, "idle_timeout_s": FIRST_BYTE_S})
    session = f"s-hang-recall-{stream}"
    history, answers = await before_a_recall(wire, gw, session)
    run = await stall_then_retry(wire, gw, upstream, session, history, [0.0, HANG_S], stream)
    assert len(run["sent"]) == 2  # the search round, then the silent one
    assert "session_search" not in run["broken"].raw.decode()  # the recall stays hidden, even failing
    check(wire, upstream, run, stream, len(answers) + 1, started=stream)
    assert "/srv/out/step2.bin" in answered_text(wire, run["retry"])
