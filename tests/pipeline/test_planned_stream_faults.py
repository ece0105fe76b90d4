"""An upstream stream that dies or stalls while the view is planned (compacted), on every
wire format, in the turn's first answer and in a recall round after a hidden search: the client gets its format's error event within the gateway's idle timeout and a
closed stream, never a hang or an answer that looks complete; the ledger keeps the client's
messages whole and records no part of the broken answer (docs/architecture.md, "A request's
path", step 7: only a complete answer is recorded); the client's retry of the very same
request is answered from a valid compacted view and its answer recorded.

The upstream is the puppet on port 0 with one fault armed for the next streamed answer
(``PuppetState.stream_faults``), so the retry is the identical request."""

from __future__ import annotations

import time

import aiohttp
import pytest

from gateway.keys import LEDGER
from tests.pipeline.formats import WIRES, events, main_requests, run_loop, step_output
from tests.pipeline.test_early_events import MARK, results
from tests.support.agent import settle

IDLE_TIMEOUT_S = 0.5
CLIENT_TIMEOUT_S = 10.0  # far above the gateway's: a client that gave up is not the gateway telling it
STEPS = 12
# Events the upstream sends before the reset: past the first text deltas in each format.
DIE_AFTER = {"chat": 3, "responses": 6, "messages": 4}
# What ends a complete stream, never seen after a fault.
COMPLETE = {"chat": lambda raw: b"data: [DONE]" in raw,
            "responses": lambda raw: any(e.get("type") == "response.completed" for e in events(raw)),
            "messages": lambda raw: any(e.get("type") == "message_stop" for e in events(raw))}
FAULTS = {"die": ("die", None), "stall": ("stall", 10.0)}

pytestmark = pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))


def compacted(wire, body: dict) -> int:
    """Tool results the upstream got as the gateway's placeholder."""
    return sum(MARK in text for _, text in results(wire.path, body))


def streamed_text(raw: bytes) -> str:
    """The answer's text as the client saw it arrive, in any of the three formats' events."""
    out = []
    for event in events(raw):
        for choice in event.get("choices") or ():
            out.append((choice.get("delta") or {}).get("content") or "")
        if event.get("type") == "response.output_text.delta":
            out.append(event["delta"])
        if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
            out.append(event["delta"]["text"])
    return "".join(out)


def ledger_path(gw, session: str) -> list:
    """The session's message events from its head back to the root, oldest first."""
    ledger = gw.app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == session)
    by_id = {e.id: e for e in ledger.since(record.key, -1) if e.kind == "message"}
    path, at = [], record.head
    while at is not None:
        path.append(by_id[at])
        at = by_id[at].parent
    return path[::-1]


def tool_names(body: dict) -> set[str]:
    return {t.get("name") or (t.get("function") or {}).get("name") for t in body.get("tools") or ()}


def armed(wire, fault: str) -> tuple[str, float]:
    kind, value = FAULTS[fault]
    return kind, value if value is not None else DIE_AFTER[wire.name]


async def break_then_retry(wire, gw, upstream, session: str, history: list, faults: list[tuple[str, float]]) -> dict:
    """The client's streamed request with `faults` armed for the upstream's next streamed
    answers, then the identical request again: what each got, what went up, the ledger between."""
    upstream.state.stream_faults.extend(faults)
    before = len(main_requests(upstream, wire))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        started = time.perf_counter()
        broken = await wire.post(http, gw.root, wire.body(history, stream=True), session=session)
        elapsed = time.perf_counter() - started
    sent = main_requests(upstream, wire)[before:]
    held = ledger_path(gw, session)
    # The gateway closes the connection after an in-stream error (too late for `Connection:
    # close`): a client that read that stream to its end reconnects, as this one does.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as http:
        retry = await wire.post(http, gw.root, wire.body(history, stream=True), session=session)
    return {"broken": broken, "elapsed": elapsed, "sent": sent, "held": held, "retry": retry,
            "resent": main_requests(upstream, wire)[before + len(sent):], "after": ledger_path(gw, session)}


def check_clean_failure_and_retry(wire, upstream, run: dict, history_outputs: list[str], client_answers: int) -> None:
    broken, held, after, retry = run["broken"], run["held"], run["after"], run["retry"]
    # Every view of the broken request went up planned and compacted, recall tools offered.
    assert run["sent"] and all(compacted(wire, body) > 0 for body in run["sent"])
    assert all({"session_search", "session_load"} <= tool_names(body) for body in run["sent"])
    # The client got its format's error event, in time, and a stream that does not look complete.
    assert broken.status == 200  # the stream had started
    assert wire.stream_error(broken.raw) is not None, broken.raw[-400:]
    assert not COMPLETE[wire.name](broken.raw)
    assert run["elapsed"] < 4 * IDLE_TIMEOUT_S + 1.0
    assert not upstream.state.stream_faults  # every armed fault was met by the broken request
    # The ledger holds every message the client sent, whole, and nothing of the broken answer.
    texts = [str(e.message.get("content")) for e in held]
    for output in history_outputs:
        assert sum(output in t for t in texts) == 1, "a tool result not held whole"
    assert sum(e.role == "assistant" for e in held) == client_answers  # the client's own: no half answer
    assert held[-1].role != "assistant"
    # The identical retry: a valid compacted view (the strict puppet answered it), a complete
    # stream, and its answer recorded as the child of the client's last message.
    assert retry.status == 200 and wire.stream_error(retry.raw) is None and COMPLETE[wire.name](retry.raw)
    assert run["resent"] and all(compacted(wire, body) > 0 for body in run["resent"])
    assert after[:-1] == held and after[-1].role == "assistant"
    assert streamed_text(retry.raw) and streamed_text(retry.raw) in str(after[-1].message.get("content"))


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_stream_that_breaks_on_a_planned_view_fails_cleanly_and_the_retry_succeeds(wire, fault, upstream,
                                                                                         start_gateway):
    gw = await start_gateway(upstream={"idle_timeout_s": IDLE_TIMEOUT_S})
    session = f"s-planned-{fault}"
    async with aiohttp.ClientSession() as http:
        history, answers = await run_loop(wire, http, gw.root, session, STEPS)
    run = await break_then_retry(wire, gw, upstream, session, history, [armed(wire, fault)])
    assert len(run["sent"]) == 1  # no retry behind the client's back
    if fault == "die":
        assert streamed_text(run["broken"].raw)  # part of the answer had reached the client before the reset
    outputs = [step_output(step, last=step == STEPS) for step in range(1, STEPS + 1)]
    check_clean_failure_and_retry(wire, upstream, run, outputs, len(answers))


async def before_a_recall(wire, gw, session: str) -> tuple[list, list]:
    """A compacted loop of `STEPS` tool rounds, its final answer, and a user question only a
    recall answers (the history and the loop's answers): the recall loop's next request."""
    async with aiohttp.ClientSession() as http:
        history, answers = await run_loop(wire, http, gw.root, session, STEPS)
        reply = await wire.post(http, gw.root, wire.body(history, stream=False), session=session)
        assert reply.status == 200 and not reply.calls
        wire.add_answer(history, reply)
    await settle(gw)
    wire.add_user(history, "RECALL: where is the artifact for step 2?")
    return history, answers


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_a_recall_round_that_breaks_on_a_planned_view_fails_cleanly_and_the_retry_succeeds(wire, fault, upstream,
                                                                                                start_gateway):
    """The break in the recall loop's second round: the client's stream started with the first
    (a hidden session_search call), the gateway ran the search, and the next answer breaks."""
    gw = await start_gateway(upstream={"idle_timeout_s": IDLE_TIMEOUT_S})
    session = f"s-recall-{fault}"
    history, answers = await before_a_recall(wire, gw, session)
    # The first streamed answer passes (a stall of 0 s), the second breaks.
    run = await break_then_retry(wire, gw, upstream, session, history, [("stall", 0.0), armed(wire, fault)])
    assert len(run["sent"]) == 2  # the search round, then the broken one: no retry behind the client's back
    assert "session_search" not in run["broken"].raw.decode()  # the recall stays hidden, even failing
    outputs = [step_output(step, last=step == STEPS) for step in range(1, STEPS + 1)]
    check_clean_failure_and_retry(wire, upstream, run, outputs, len(answers) + 1)
    assert "/srv/out/step2.bin" in streamed_text(run["retry"].raw)
