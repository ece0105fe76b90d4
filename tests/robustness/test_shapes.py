"""Every format's declared request shape, fuzzed through the real gateway over HTTP.

The corpus is generated from the declarations the parsers themselves check
(``gateway/chat/shape.py``, ``gateway/responses/shape.py``, ``gateway/messages/shape.py``):
valid bodies are drawn from each declaration, then mutated at every depth (a node replaced by
junk, a key deleted, junk appended to an array). Each body goes to the gateway over loopback,
with the strict simulator as the upstream (tests/robustness/rig.py), and for each answer:

- never a 5xx the gateway made;
- every 4xx in the envelope of the API it came in on (OpenAI's on chat and Responses,
  Anthropic's on ``/v1/messages`` and ``/v1/messages/count_tokens``);
- a body its declaration refuses is a 400 from the gateway naming the field the declaration
  names, and the session it named holds nothing afterwards.

Then the cases of issue 26 item 3 one by one, on every format: each a 400 naming the field,
and a session that already had history has exactly as many events after it as before.

Generation is deterministic (``derandomize=True``) and bounded: the module runs in seconds.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.chat import shape as chat_shape
from gateway.keys import LEDGER
from gateway.messages import shape as messages_shape
from gateway.pipeline import shape as sh
from gateway.responses import shape as responses_shape
from tests.robustness.rig import ORIGIN, Rig
from tests.robustness.test_fuzz import Http

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))

# -- the formats -------------------------------------------------------------------------------

FORMATS = {
    "chat": {"paths": ["/v1/chat/completions"], "decl": chat_shape, "anthropic": False},
    "responses": {"paths": ["/v1/responses"], "decl": responses_shape, "anthropic": False},
    "messages": {"paths": ["/v1/messages", "/v1/messages/count_tokens"], "decl": messages_shape, "anthropic": True},
}
HEADERS = {"Content-Type": "application/json", "anthropic-version": "2023-06-01",
           "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07"}

# -- strategies from a declaration -------------------------------------------------------------

WORDS = st.sampled_from(["hi", "go on", "read_file", "call_1", "toolu_1", "", "🙂", "RECALL: the deploy id?"])
JUNK = st.sampled_from([5, -1, 2.5, None, True, "x", "", [], {}, [5], [None], [{}], [{"text": "x"}], {"type": 5}])
OVERRIDES: dict[str, st.SearchStrategy] = {
    "model": st.just("fake-32k"),
    "max_tokens": st.integers(1, 64), "max_output_tokens": st.integers(16, 64), "max_completion_tokens": st.integers(1, 64),
    "stream": st.booleans(),
}
FUTURE_TYPES = ["some_future_item", "image", "web_search_call"]


def valid(shape: sh.Shape, name: str | None = None) -> st.SearchStrategy:
    """Values the declaration accepts."""
    if name in OVERRIDES:
        return OVERRIDES[name]
    if isinstance(shape, sh.Kind):
        return {id(sh.STRING): WORDS, id(sh.TEXT): WORDS.filter(bool), id(sh.COUNT): st.integers(0, 64),
                id(sh.BOOL): st.booleans(), id(sh.OBJECT): st.just({}), id(sh.ANY): st.just("x")}[id(shape)]
    if isinstance(shape, sh.Enum):
        return st.sampled_from(shape.values)
    if isinstance(shape, sh.ListOf):
        return st.lists(valid(shape.item), min_size=1 if shape.nonempty else 0, max_size=3)
    if isinstance(shape, sh.Either):
        return st.one_of(*(valid(o) for o in shape.options))
    if isinstance(shape, sh.Tagged):
        cases = [valid(case).map(lambda d, k=kind: {**d, shape.tag: k}) for kind, case in shape.cases.items()]
        cases += [valid(case).map(lambda d, k=end: {**d, shape.tag: "future" + k}) for end, case in shape.suffixes.items()]
        if shape.other is not None:
            cases.append(valid(shape.other).map(lambda d: d if isinstance(d, dict) else {}).flatmap(
                lambda d: st.sampled_from(FUTURE_TYPES).map(lambda k: {**d, shape.tag: k})))
        return st.one_of(*cases)
    assert isinstance(shape, sh.Obj), shape
    required = {k: valid(v, k) for k, v in shape.fields.items() if k in shape.required}
    optional = {k: valid(v, k) for k, v in shape.fields.items() if k not in shape.required}
    return st.fixed_dictionaries(required, optional=optional)


def locations(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value, the value itself included."""
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += locations(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += locations(item, (*path, i))
    return out


WIRE = Path(__file__).parents[1] / "fixtures/wire"


def recorded(name: str) -> dict:
    return orjson.loads((WIRE / name).read_bytes())["body"]


@st.composite
def mutated(draw, shape: sh.Shape, seeds: list[dict]) -> dict:
    """A body from the declaration, or a real client's, with one node changed at any depth."""
    body = draw(st.one_of(valid(shape), st.sampled_from(seeds).map(lambda b: orjson.loads(orjson.dumps(b)))))
    path = draw(st.sampled_from(locations(body)[1:]))
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    action, junk = draw(st.sampled_from(["replace", "replace", "delete", "append"])), draw(JUNK)
    target = parent[path[-1]]
    if action == "append" and isinstance(target, list):
        target.append(junk)
    elif action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = junk
    return body


# -- the rig -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rig = Rig(tmp_path_factory.mktemp("shapes") / "data").start()
    rig.http = Http(rig.url)
    yield rig
    rig.http.close()
    rig.stop()


SESSIONS = itertools.count()


def events(rig: Rig, session: str) -> int:
    """The events the ledger holds for `session` (0 when it has no such session)."""

    async def read() -> int:
        return sum(r.events for r in rig.gateway_app[LEDGER].sessions() if r.session_id == session)

    return rig.on_gateway(read())


def post(rig: Rig, path: str, body: dict, session: str) -> tuple[int, dict[str, str], Any]:
    status, headers, payload = rig.http.request("POST", path, orjson.dumps(body), {**HEADERS, "X-Session-Id": session})
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = payload  # a stream
    return status, headers, data


def refusal(fmt: str, data: Any) -> tuple[str, str | None]:
    """(message, param) of an error in the format's own envelope (fails on any other shape)."""
    assert isinstance(data, dict), data
    if FORMATS[fmt]["anthropic"]:
        assert data.get("type") == "error" and set(data["error"]) == {"type", "message"}, data
        return data["error"]["message"], None
    assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}, data
    return data["error"]["message"], data["error"]["param"]


def declared(fmt: str, body: dict) -> sh.Invalid | None:
    try:
        FORMATS[fmt]["decl"].REQUEST.check(body)
    except sh.Invalid as exc:
        return exc
    return None


def exchange(rig: Rig, fmt: str, path: str, body: dict) -> None:
    """One body through the gateway, and everything the corpus checks about its answer."""
    session = f"shape-{next(SESSIONS)}"
    status, headers, data = post(rig, path, body, session)
    upstream = headers.get(ORIGIN) == "upstream"
    assert status < 500 or upstream, (status, data, body)
    if status >= 400:
        refusal(fmt, data)
    wrong = declared(fmt, body)
    if wrong is None:
        return
    message, param = refusal(fmt, data)
    assert status == 400 and not upstream, (status, data, body)
    decl = FORMATS[fmt]["decl"]
    name = decl.STYLE.param(wrong.path)
    assert (param == name) if not FORMATS[fmt]["anthropic"] else message.startswith(f"{name}:"), (message, param, name)
    assert events(rig, session) == 0  # refused: nothing stored


TOOL_ROUND = {
    "chat": lambda result: [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}],
    "responses": lambda result: [
        {"type": "message", "role": "user", "content": "run it"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": result}],
    "messages": lambda result: [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}],
}


def body_of(fmt: str, items: list, **extra: Any) -> dict:
    key = "input" if fmt == "responses" else "messages"
    body = {"model": "fake-32k", key: items, **extra}
    if fmt == "messages":
        body.setdefault("max_tokens", 32)
    return body


def user(fmt: str, content: Any) -> dict:
    return {"type": "message", "role": "user", "content": content} if fmt == "responses" else {"role": "user", "content": content}


SEEDS = {
    "chat": [body_of("chat", [user("chat", "hello")]), body_of("chat", TOOL_ROUND["chat"]("done")),
             body_of("chat", [user("chat", [{"type": "text", "text": "look"},
                                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])])],
    "responses": [recorded("codex-tool-round.json"), body_of("responses", TOOL_ROUND["responses"]("done")),
                  body_of("responses", [user("responses", [{"type": "input_text", "text": "hello"}])])],
    "messages": [recorded("claude-tool-round.json"), recorded("claude-2.1.332-tool-round.json"),
                 body_of("messages", TOOL_ROUND["messages"]("done")),
                 body_of("messages", TOOL_ROUND["messages"]([{"type": "text", "text": "done"}]))],
}
STRATEGIES = {fmt: {"valid": valid(f["decl"].REQUEST), "mutated": mutated(f["decl"].REQUEST, SEEDS[fmt])}
              for fmt, f in FORMATS.items()}


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_bodies_mutated_at_every_depth_are_a_2xx_or_a_4xx_in_their_envelope(rig, fmt, data):
    body = data.draw(STRATEGIES[fmt]["mutated"], label="body")
    exchange(rig, fmt, data.draw(st.sampled_from(FORMATS[fmt]["paths"]), label="path"), body)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_bodies_the_declaration_accepts_are_never_a_gateway_5xx(rig, fmt, data):
    body = data.draw(STRATEGIES[fmt]["valid"], label="body")
    exchange(rig, fmt, data.draw(st.sampled_from(FORMATS[fmt]["paths"]), label="path"), body)


# -- issue 26 item 3, case by case -------------------------------------------------------------

TEXT_PART = {"chat": "text", "responses": "input_text", "messages": "text"}
CASES = [
    # (format, body, the field named)
    *[(f, body_of(f, [user(f, [5, None])]), {"chat": "messages[0].content[0]", "responses": "input[0].content[0]",
                                             "messages": "messages.0.content.0"}[f]) for f in FORMATS],
    *[(f, body_of(f, [user(f, [{"type": TEXT_PART[f], "text": 5}])]),
       {"chat": "messages[0].content[0].text", "responses": "input[0].content[0].text",
        "messages": "messages.0.content.0.text"}[f]) for f in FORMATS],
    *[(f, body_of(f, TOOL_ROUND[f](result)), {"chat": "messages[2].content[0]", "responses": "input[2].output[0]",
                                             "messages": "messages.2.content.0.content.0"}[f] + tail)
      for f in FORMATS for result, tail in [([5], ""), ([None], ""), ([{}], ".type"), ([{"text": "x"}], ".type")]],
    ("responses", body_of("responses", [user("responses", "hi")], reasoning="high"), "reasoning"),
    ("responses", body_of("responses", [user("responses", "hi"), {"type": "reasoning", "summary": "thought"},
                                        user("responses", "go")]), "input[1].summary"),
    ("responses", body_of("responses", [user("responses", "hi"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": 5}]},
                                        user("responses", "go")]), "input[1].summary[0].text"),
    ("messages", body_of("messages", [user("messages", "hi"), {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": 5}, {"type": "text", "text": "ok"}]}, user("messages", "go")]),
     "messages.1.content.0.signature"),
    ("messages", body_of("messages", [user("messages", "hi"), {"role": "assistant", "content": [
        {"type": "redacted_thinking", "data": 5}]}, user("messages", "go")]), "messages.1.content.0.data"),
    ("messages", body_of("messages", [user("messages", "hi"), {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": "ls"}]}]), "messages.1.content.0.input"),
]


@pytest.mark.parametrize("fmt, body, field", CASES, ids=[f"{i}-{c[0]}-{c[2]}" for i, c in enumerate(CASES)])
def test_nested_junk_is_a_400_naming_the_field_and_stores_nothing(rig, fmt, body, field):
    for path in FORMATS[fmt]["paths"]:
        session = f"case-{next(SESSIONS)}"
        # A session with history first: the refused body must add nothing to it.
        status, _, data = post(rig, FORMATS[fmt]["paths"][0], body_of(fmt, [user(fmt, "hello there")]), session)
        assert status == 200, data
        before = settled_events(rig, session)
        status, headers, data = post(rig, path, body, session)
        message, param = refusal(fmt, data)
        assert status == 400 and headers.get(ORIGIN) != "upstream", (status, data)
        if FORMATS[fmt]["anthropic"]:
            assert message.startswith(f"{field}:"), message
        else:
            assert param == field, (param, message)
        assert settled_events(rig, session) == before


def settled_events(rig: Rig, session: str) -> int:
    """The session's event count once it stops moving (the answer of the request before is
    recorded after the client has it)."""
    count = events(rig, session)
    for _ in range(40):
        time.sleep(0.05)
        again = events(rig, session)
        if again == count:
            return count
        count = again
    return count


@pytest.mark.parametrize("fixture", ["codex-tool-round.json", "claude-tool-round.json", "claude-2.1.332-tool-round.json"])
def test_the_recorded_client_bodies_have_their_declared_shape(fixture):
    recorded = orjson.loads((Path(__file__).parents[1] / "fixtures/wire" / fixture).read_bytes())["body"]
    fmt = "responses" if fixture.startswith("codex") else "messages"
    assert declared(fmt, recorded) is None
