"""What a model may legitimately answer, fuzzed on the upstream side, on every wire format, JSON
and streamed: the gateway's recall loop and stream filter sit in the middle of every answer, and
other models behave differently from the one the simulator's script plays.

One session per format and mode is compacted first (a chain of tool rounds), so every request
after it carries the recall tools. Each example then asks one more question with a drawn
sequence of answers armed in the puppet (``PuppetState.planned``): text, empty text, client tool
calls (one or several), recall calls (alone, mixed with a client call, past the round limit,
with malformed or empty arguments or an unknown id), answers cut by the output limit (inside a
recall call too), refusals and content filters, reasoning before calls, usage missing or zero.

Properties: the client gets a 200 its format's official SDK types parse; no recall tool name,
call or result reaches it; what it got is the model's client-visible part of the answers the
gateway used (a recall round's text included); usage is summed over the rounds; the answer is
recorded once; the next plain request works.
"""

from __future__ import annotations

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

from gateway.keys import LEDGER
from simulator.counting import content_text
from simulator.script import Answer
from tests.pipeline.client_reads import client_view, continued
from tests.pipeline.formats import TOOL_NAME, WIRES, events, main_requests, run_loop

STEPS = 12
MAX_ROUNDS = 3  # recall.max_rounds: the default
RECALL = ("session_search", "session_load")
SEARCH_ARGS = ['{"query": "artifact for step 2"}', '{"query": ""}', "", "{not json", "[]", '{"q": 1}']
LOAD_ARGS = ['{"event_id": "ev-nowhere"}', '{"event_id": 7}', "{}", "nope"]
WORDS = st.text(alphabet="abcdefgh xyz.,", min_size=0, max_size=30)


KINDS = ["text", "client", "recall", "mixed", "cut_text", "cut_call", "refusal", "filter", "plain_calls"]
CUT = ("length", "filter")


@st.composite
def answers(draw, kinds: list[str] = KINDS) -> Answer:
    """One valid model answer of one of `kinds` (see the module docstring)."""
    kind = draw(st.sampled_from(kinds))
    usage = draw(st.sampled_from(["", "", "zero", "missing"]))
    tokens = draw(st.integers(1, 400)) if not usage else None
    # The model's own words before its calls (the simulator's default would name the calls).
    reasoning = draw(st.sampled_from(["Let me look."]) | WORDS.filter(bool))
    text = draw(WORDS)
    client = [(TOOL_NAME, orjson.dumps({"command": f"c{k}"}).decode()) for k in range(draw(st.integers(1, 3)))]
    recall = draw(st.lists(st.sampled_from([("session_search", a) for a in SEARCH_ARGS]
                                           + [("session_load", a) for a in LOAD_ARGS]), min_size=1, max_size=2))
    if kind == "text":  # chat renders reasoning here too (reasoning_content)
        return Answer(content=text, reasoning=draw(st.none() | st.just(reasoning)), usage=usage, output_tokens=tokens)
    if kind == "plain_calls":  # calls ending with finish_reason "stop" (chat; a natural end elsewhere)
        return Answer(calls=draw(st.sampled_from([client, recall])), reasoning=reasoning, stop="plain", usage=usage,
                      output_tokens=tokens)
    if kind == "client":
        return Answer(content=text or None, calls=client, reasoning=reasoning, usage=usage, output_tokens=tokens)
    if kind == "recall":
        return Answer(content=text or None, calls=recall, reasoning=reasoning, usage=usage, output_tokens=tokens)
    if kind == "mixed":
        calls = draw(st.permutations([*client[:1], *recall]))
        return Answer(content=text or None, calls=list(calls), reasoning=reasoning, usage=usage, output_tokens=tokens)
    if kind == "cut_text":
        return Answer(content=text, stop="length", usage=usage, output_tokens=tokens)
    if kind == "cut_call":  # cut inside the last call's arguments
        name = draw(st.sampled_from(["session_search", "session_search", TOOL_NAME]))
        return Answer(calls=[*draw(st.sampled_from([[], client[:1]])), (name, '{"query": "artif')], stop="length",
                      reasoning=reasoning, usage=usage, output_tokens=tokens)
    if kind == "refusal":
        return Answer(refusal=text or "I can't help with that.", usage=usage, output_tokens=tokens)
    return Answer(content=text, stop="filter", usage=usage, output_tokens=tokens)


def is_recall_round(answer: Answer, rounds: int) -> bool:
    """The recall loop's rule: only recall calls, whole, while rounds remain."""
    names = [name for name, _ in answer.calls]
    return bool(names) and all(n in RECALL for n in names) and answer.stop not in CUT and rounds < MAX_ROUNDS


def expected(plan: list[Answer]) -> tuple[list[Answer], str, list[str]]:
    """(the answers the gateway uses, the client's text, the client's call names)."""
    used, rounds = [], 0
    for answer in plan:
        used.append(answer)
        if not is_recall_round(answer, rounds):
            break
        rounds += 1
    text = "".join(a.content or "" for a in used)
    calls = [name for name, _ in used[-1].calls if name not in RECALL]
    return used, text, calls


# -- the test ----------------------------------------------------------------------------------

def assistant_count(gw, session: str) -> int:
    ledger = gw.app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == session)
    return sum(e.kind == "message" and e.role == "assistant" for e in ledger.since(record.key, -1))


async def compacted_session(wire, upstream, start_gateway, session: str) -> dict:
    """A gateway and a session compacted by a chain of tool rounds and closed by an answer: every
    request after it carries the recall tools."""
    gw = await start_gateway()
    async with aiohttp.ClientSession() as http:
        history, _ = await run_loop(wire, http, gw.root, session, STEPS)
        reply = await wire.post(http, gw.root, wire.body(history, stream=False), session=session)
        assert reply.status == 200 and not reply.calls
    wire.add_answer(history, reply)
    return {"upstream": upstream, "gw": gw, "session": session, "history": history, "n": 0}


async def ask_planned(wire, state: dict, plan: list[Answer], stream: bool):
    """One more question on the session with `plan` armed: the answer and what went up for it."""
    upstream, gw = state["upstream"], state["gw"]
    asked = [*state["history"]]
    wire.add_user(asked, "what next?")
    before = len(main_requests(upstream, wire))
    upstream.state.planned[:] = plan
    try:
        async with aiohttp.ClientSession() as http:
            answer = await wire.post(http, gw.root, client_body(wire, asked, stream), session=state["session"])
    finally:
        upstream.state.planned.clear()
    return answer, main_requests(upstream, wire)[before:]


ENDING = {"chat": lambda raw, stream: ([e["choices"][0]["finish_reason"] for e in events(raw) if e.get("choices")
                                        and e["choices"][0].get("finish_reason")] or [None])[-1] if stream
          else orjson.loads(raw)["choices"][0]["finish_reason"],
          "responses": lambda raw, stream: ([e["response"]["status"] for e in events(raw) if e.get("response")][-1] if stream
                                            else orjson.loads(raw)["status"]),
          "messages": lambda raw, stream: ([e["delta"]["stop_reason"] for e in events(raw)
                                            if e.get("type") == "message_delta"][-1] if stream
                                           else orjson.loads(raw)["stop_reason"])}
CUT_ENDING = {"chat": "length", "responses": "incomplete", "messages": "max_tokens"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_recall_call_cut_by_the_output_limit_is_not_run(wire, stream, upstream, start_gateway):
    """An answer cut inside a recall call's arguments ends the turn: the gateway does not run a
    call it cannot read whole; the client gets the text and the cut ending, not the call."""
    state = await compacted_session(wire, upstream, start_gateway, "s-cut")
    plan = [Answer(content="Looking", calls=[("session_search", '{"query": "artif')], stop="length", reasoning="Let me look."),
            Answer(content="a second answer the turn must not ask for")]
    answer, sent = await ask_planned(wire, state, plan, stream)
    assert answer.status == 200 and len(sent) == 1
    assert not any(name in answer.raw.decode() for name in RECALL)
    got = client_view(wire.name, answer.raw, stream)
    assert got["text"] == "Looking" and got["calls"] == []
    assert ENDING[wire.name](answer.raw, stream) == CUT_ENDING[wire.name]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_recall_rounds_text_reaches_the_client_in_json_as_in_a_stream(wire, stream, upstream, start_gateway):
    """A model that says something before its recall call: the client gets those words before
    the final answer's, JSON or streamed."""
    state = await compacted_session(wire, upstream, start_gateway, "s-said")
    plan = [Answer(content="Let me check. ", calls=[("session_search", '{"query": "artifact for step 2"}')], reasoning="Let me look."),
            Answer(content="Found it.")]
    answer, sent = await ask_planned(wire, state, plan, stream)
    assert answer.status == 200 and len(sent) == 2
    assert not any(name in answer.raw.decode() for name in RECALL)
    assert client_view(wire.name, answer.raw, stream)["text"] == "Let me check. Found it."


def reasoning_cut_from_its_calls(wire: str, answer: Answer) -> bool:
    """A Responses answer whose reasoning item came with client and recall calls: the client
    gets the reasoning and its client calls, and sending them back is refused ("reasoning was
    provided without its required following item": the recall call is missing). Known, not
    fixed yet: test_a_reasoning_item_split_from_a_recall_call_can_be_sent_back (xfail)."""
    names = {name for name, _ in answer.calls}
    return wire == "responses" and bool(names & set(RECALL)) and bool(names - set(RECALL))


def newest_answer(gw, session: str) -> dict:
    ledger = gw.app[LEDGER]
    record = next(r for r in ledger.sessions() if r.session_id == session)
    return [e for e in ledger.since(record.key, -1) if e.kind == "message" and e.role == "assistant"][-1].message


def client_body(wire, history: list, stream: bool) -> dict:
    body = wire.body(history, stream=stream)
    if wire.name == "responses":
        body["include"] = ["reasoning.encrypted_content"]  # reasoning items come back, as a reasoning model's do
    if wire.name == "messages":
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}  # thinking blocks before calls
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
@settings(max_examples=60, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.one_of(
    st.lists(answers(), min_size=1, max_size=MAX_ROUNDS + 2),
    # a model that keeps calling recall past the round limit (offered the tools or not)
    st.tuples(st.lists(answers(["recall"]), min_size=1, max_size=MAX_ROUNDS + 1), answers()).map(
        lambda chain: [*chain[0], chain[1]])))
# The brief's named cases, always run besides the drawn ones.
@example(plan=[Answer(content="Let me", calls=[("session_search", '{"query": "artif')], stop="length",
                      reasoning="Let me look.", output_tokens=9)])
@example(plan=[Answer(calls=[("session_search", '{"query": "step 2"}')], reasoning="Let me look.", output_tokens=7)]
         * (MAX_ROUNDS + 1))
@example(plan=[Answer(calls=[(TOOL_NAME, '{"command": "ls"}'), ("session_load", "nope")], reasoning="Let me look.",
                      output_tokens=5)])
async def test_every_valid_model_behaviour_reaches_the_client_whole_and_recall_never_does(wire, stream, plan, upstream,
                                                                                         start_gateway):
    state = setups.get(id(upstream))
    if state is None or state["upstream"] is not upstream:  # once per format and mode
        state = setups[id(upstream)] = await compacted_session(wire, upstream, start_gateway, f"s-behave-{wire.name}-{stream}")
    gw, session, history = state["gw"], state["session"], state["history"]
    state["n"] += 1
    asked = [*history]
    wire.add_user(asked, f"question {state['n']}: what next?")
    plan = [*plan, Answer(content="The end.", output_tokens=3)]  # when every drawn answer was a recall round
    used, text, calls = expected(plan)
    event(f"upstream calls={len(used)}")  # --hypothesis-show-statistics: what the examples reached
    event("ending=" + ("cut" if used[-1].stop in CUT else "refusal" if used[-1].refusal is not None else "whole"))
    before_rounds, before_answers = len(main_requests(upstream, wire)), assistant_count(gw, session)
    upstream.state.planned[:] = plan
    try:
        async with aiohttp.ClientSession() as http:
            answer = await wire.post(http, gw.root, client_body(wire, asked, stream), session=session)
    finally:
        left = len(upstream.state.planned)
        upstream.state.planned.clear()
    sent = main_requests(upstream, wire)[before_rounds:]
    assert answer.status == 200, answer.raw[:500]
    assert len(sent) == len(used) and left == len(plan) - len(used), (len(sent), len(used))
    # recall on offer for max_rounds rounds, then one call without it
    assert [set(RECALL) <= tool_names(body) for body in sent] == [i < MAX_ROUNDS for i in range(len(sent))]
    assert not any(set(RECALL) & tool_names(body) for body in sent[MAX_ROUNDS:])
    raw = answer.raw.decode()
    assert not any(name in raw for name in RECALL), raw[:800]  # no recall name or call
    assert "/srv/out/" not in raw and "checkpoint-" not in raw  # nor a recall result (the session's facts)
    got = client_view(wire.name, answer.raw, stream)
    if wire.name == "messages":  # Anthropic's refusal is the text of a stop_reason "refusal" answer
        text += used[-1].refusal or ""
    assert got["text"] == text
    assert got["calls"] == calls
    last = used[-1]
    if last.refusal is not None:
        assert got["refusal"] == last.refusal if wire.name != "messages" else got["text"].endswith(last.refusal)
    else:
        assert not got["refusal"]
    reported = sum(a.output_tokens for a in used if not a.usage)  # summed over the rounds that reported any
    assert got["output"] == reported if reported else got["output"] in (None, 0), (got["output"], reported)
    recorded = assistant_count(gw, session) - before_answers
    assert recorded <= 1  # never twice
    if last.stop not in CUT and (got["text"] or got["refusal"] or got["calls"]):
        assert recorded == 1  # a whole answer with something in it is recorded
    if recorded:  # as the client got it
        kept = newest_answer(gw, session)
        assert content_text(kept.get("content")) in (got["text"], got["refusal"])
        assert [c["function"]["name"] for c in kept.get("tool_calls") or ()] == got["calls"]

    # The next request works: the client's answer sent back as it got it (with its calls'
    # results), as an agent goes on; after a cut answer, the question asked again.
    follow = asked if last.stop in CUT or reasoning_cut_from_its_calls(wire.name, last) else continued(
        wire.name, asked, answer.raw, stream)
    async with aiohttp.ClientSession() as http:
        nxt = await wire.post(http, gw.root, client_body(wire, follow, stream), session=session)
    assert nxt.status == 200, nxt.raw[:300]
    assert "session_search" not in nxt.raw.decode()


setups: dict[int, dict] = {}


def tool_names(body: dict) -> set[str]:
    return {t.get("name") or (t.get("function") or {}).get("name") for t in body.get("tools") or ()}


SEARCH = ("session_search", '{"query": "artifact for step 2"}')

async def sent_back_and_answered(wire, state: dict, answer, stream: bool) -> None:
    """The client's next request, carrying `answer` as the client got it, is answered."""
    asked = [*state["history"]]
    wire.add_user(asked, "what next?")
    follow = continued(wire.name, asked, answer.raw, stream)
    async with aiohttp.ClientSession() as http:
        nxt = await wire.post(http, state["gw"].root, client_body(wire, follow, stream), session=state["session"])
    assert nxt.status == 200, nxt.raw[:300]



@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", list(WIRES.values()), ids=list(WIRES))
async def test_a_recall_call_past_the_round_limit_leaves_no_reasoning_alone(wire, stream, upstream, start_gateway):
    """Past recall.max_rounds the model is asked without the recall tools and calls one anyway,
    after its reasoning: the call is dropped, and so is a Responses reasoning item nothing shown
    follows (in a stream as in JSON), so the client can send its answer back."""
    state = await compacted_session(wire, upstream, start_gateway, "s-limit")
    thinking = Answer(calls=[SEARCH], reasoning="Let me look.")
    answer, sent = await ask_planned(wire, state, [thinking] * (MAX_ROUNDS + 1) + [Answer(content="unused")], stream)
    assert answer.status == 200 and len(sent) == MAX_ROUNDS + 1
    assert not any(name in answer.raw.decode() for name in RECALL)
    if wire.name == "responses":
        response = ([e["response"] for e in events(answer.raw) if e.get("type") == "response.completed"][-1]
                    if stream else orjson.loads(answer.raw))
        assert [item["type"] for item in response["output"]] == []
        assert not any(e.get("type") == "response.output_item.added" for e in events(answer.raw))
    await sent_back_and_answered(wire, state, answer, stream)


@pytest.mark.xfail(strict=True, reason="known: the reasoning item of an answer that mixes client and recall calls "
                   "reaches the client without the recall call it binds, and the provider refuses it sent back")
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_reasoning_item_split_from_a_recall_call_can_be_sent_back(stream, upstream, start_gateway):
    wire = WIRES["responses"]
    state = await compacted_session(wire, upstream, start_gateway, "s-split")
    mixed = Answer(calls=[(TOOL_NAME, '{"command": "ls"}'), SEARCH], reasoning="Let me look.")
    answer, _ = await ask_planned(wire, state, [mixed], stream)
    assert answer.status == 200 and client_view(wire.name, answer.raw, stream)["calls"] == [TOOL_NAME]
    await sent_back_and_answered(wire, state, answer, stream)
