"""Hostile input: a hypothesis corpus of more than 10,000 request bodies against a real gateway.

One gateway (and one puppet upstream) serves the whole module, on loops of their own
(tests/robustness/rig.py), and every body of every test below goes to it over loopback. For each
response the corpus checks:

- no 5xx made by the gateway itself (a 5xx the upstream chose, tagged by the rig, is relayed
  faithfully and allowed: the corpus sends a few ``[[fail 5xx]]`` scripts on purpose),
- every 4xx is the OpenAI error envelope,
- a 200 stream ends (the client's timeout turns a hang into a failure).

Violations are collected, not raised at the first one, so a failing run lists every distinct
kind of failure with the smallest body that showed it. After the corpus (the last test of the
module): the bodies sent add up to at least 10,000, a normal request still works, every session's
ledger reads back, ``PRAGMA integrity_check`` is ok on every SQLite file, and the gateway's event
loop never stalled for a second (the worst lag is printed).

Generation is deterministic (``derandomize=True``, no example database): CI sees the same
corpus every run.
"""

from __future__ import annotations

import http.client
import json
import socket
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from store.ledger import Ledger
from tests.robustness.rig import ORIGIN, Rig

# -- the rig and the bookkeeping ---------------------------------------------------------------


@dataclass
class Corpus:
    rig: Rig
    http: "Http"
    sent: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    upstream_5xx: int = 0
    violations: dict[tuple, tuple[int, str, bytes]] = field(default_factory=dict)  # key -> (count, detail, body)
    finished: set[str] = field(default_factory=set)

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST") -> None:
        self.sent += 1
        self.rig.lag.label = f"{method} {path} ({len(body):,} bytes)"
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        try:
            status, response_headers, payload = self.http.request(method, path, body, hdrs)
        except (TimeoutError, socket.timeout) as exc:
            self._violation(("hang", path, type(exc).__name__), "no answer within the client timeout", body)
            return
        except (OSError, http.client.HTTPException) as exc:
            self._violation(("transport", path, type(exc).__name__), str(exc)[:200], body)
            return
        self.check(path, status, response_headers, payload, body)

    def check(self, path: str, status: int, headers: dict[str, str], payload: bytes, body: bytes) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1
        from_upstream = headers.get(ORIGIN) == "upstream"
        if status >= 500:
            if from_upstream:
                self.upstream_5xx += 1
                if b"puppet_bug" in payload:
                    self._violation(("puppet bug", path), payload[:300].decode("utf-8", "replace"), body)
            else:
                self._violation(("gateway 5xx", path, status, _error_code(payload)), payload[:300].decode("utf-8", "replace"), body)
        elif status >= 400:
            if not _is_envelope(payload):
                self._violation(("4xx not an OpenAI envelope", path, status, from_upstream),
                                payload[:300].decode("utf-8", "replace"), body)
        elif status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
            if b"[DONE]" not in payload and b'"error"' not in payload:
                self._violation(("stream ended without [DONE] or an error event", path), payload[-200:].decode("utf-8", "replace"), body)

    def _violation(self, key: tuple, detail: str, body: bytes) -> None:
        count, old_detail, old_body = self.violations.get(key, (0, detail, body))
        keep = body if len(body) < len(old_body) else old_body
        self.violations[key] = (count + 1, old_detail if keep is old_body else detail, keep)

    def assert_clean(self, test: str) -> None:
        self.finished.add(test)
        if self.violations:
            lines = [f"{count}x {key}: {detail}\n    smallest body: {body[:400]!r}"
                     for key, (count, detail, body) in sorted(self.violations.items(), key=str)]
            found = "\n".join(lines)
            self.violations.clear()
            pytest.fail(f"{len(lines)} kinds of violation after {self.sent} bodies:\n{found}")


def _error_code(payload: bytes) -> str | None:
    try:
        return (orjson.loads(payload).get("error") or {}).get("code")
    except Exception:
        return None


def _is_envelope(payload: bytes) -> bool:
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    error = data.get("error") if isinstance(data, dict) else None
    return (isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
            and "param" in error and "code" in error)


class Http:
    """A keep-alive HTTP/1.1 client on the standard library (reconnects after a closed connection)."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port, self.timeout = host, int(port), timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                payload = response.read()
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
                # The gateway may close a connection after an error response; a request that
                # never reached it is resent once on a fresh connection.
                self.close()
                if attempt:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, payload
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, value=None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        status, _, payload = self.request(method, path, None if value is None else orjson.dumps(value),
                                          {"Content-Type": "application/json", **(headers or {})})
        return status, orjson.loads(payload) if payload else {}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    store = tmp_path_factory.mktemp("fuzz") / "data"
    rig = Rig(store).start()
    http = Http(rig.url)
    yield Corpus(rig, http)
    http.close()
    rig.stop()


# PALIMPSEST_FUZZ_SCALE=0.05 runs a twentieth of the corpus while developing (the count check is then skipped).
SCALE = float(os.environ.get("PALIMPSEST_FUZZ_SCALE", "1"))
STALL_BOUND_S = float(os.environ.get("PALIMPSEST_FUZZ_STALL_BOUND_S", "2.0"))
FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=list(HealthCheck))

# -- strategies --------------------------------------------------------------------------------

SCRIPTS = ["hi", "Hi", "[[fail 500]]", "[[fail 503]]", "[[fail 429]]", "[[fail 400]]", "[[call read_file {\"target\": \"a.py\"}]]",
           "[[parallel read_file run_tests]]", "RECALL: what was the deploy id?", "[[call]]", "[[call x {not json",
           "\u0000", "\ud7ff\ue000", "🙂" * 30, "\r\n\r\ndata: [DONE]\n\n", "## Summary\n## State"]
TEXT = st.one_of(st.sampled_from(SCRIPTS), st.text(max_size=60), st.text(st.characters(codec="utf-8"), max_size=300))
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)
ROLES = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"]),
                  st.sampled_from(["", "User", "bot", "model", "ai", "tool_result"]), JUNK)
CALL_IDS = st.one_of(st.sampled_from(["call_1", "call_2", "call_dup", "", "call_🙂"]), st.text(max_size=10))
PART = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": st.just("data:image/png;base64,AAAA")})}),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_audio", "refusal", "x"]), "text": JUNK}),
    TEXT, JUNK,
)
CONTENT = st.one_of(TEXT, st.none(), st.lists(PART, max_size=4), JUNK)
FUNCTION = st.one_of(
    st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["read_file", "session_search", "session_load"]), TEXT),
                           "arguments": st.one_of(st.just("{}"), st.just("{\"target\": 1}"), TEXT, JUNK)}),
    st.fixed_dictionaries({}, optional={"name": JUNK, "arguments": JUNK}), JUNK,
)
TOOL_CALL = st.one_of(
    st.fixed_dictionaries({"id": CALL_IDS, "type": st.just("function"), "function": FUNCTION}),
    st.fixed_dictionaries({}, optional={"id": st.one_of(CALL_IDS, JUNK), "type": JUNK, "function": FUNCTION, "index": JUNK}),
    JUNK,
)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES},
    optional={"content": CONTENT, "tool_calls": st.one_of(st.lists(TOOL_CALL, max_size=3), JUNK),
              "tool_call_id": st.one_of(CALL_IDS, JUNK), "name": st.one_of(TEXT, JUNK), "refusal": JUNK,
              "extra": JUNK},
)
TOOL_SPEC = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.one_of(st.sampled_from(["read_file", "run_tests", "session_search"]), TEXT)},
        optional={"parameters": st.one_of(st.just({"type": "object", "properties": {}}), JUNK), "description": JUNK})}),
    st.fixed_dictionaries({}, optional={"type": JUNK, "function": JUNK}), JUNK,
)
MODEL = st.one_of(st.sampled_from(["fake-32k", "fake-32k", "fake-8k", "gpt-4o", "model-9k", ""]), JUNK)
OPTIONAL_FIELDS = {
    "stream": st.one_of(st.booleans(), st.booleans(), JUNK),
    "n": st.one_of(st.integers(-1, 3), JUNK),
    "tools": st.one_of(st.lists(TOOL_SPEC, max_size=4), JUNK),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), JUNK),
    "max_tokens": st.one_of(st.integers(-5, 40_000), JUNK),
    "max_completion_tokens": st.one_of(st.integers(-5, 40_000), JUNK),
    "stream_options": st.one_of(st.just({"include_usage": True}), JUNK),
    "temperature": JUNK,
    "user": JUNK,
}
HEADERS = st.fixed_dictionaries({}, optional={
    "X-Session-Id": st.sampled_from(["fz-1", "fz-2", "fz-3", "fz-4", " ", "x" * 300, "fz-ü".encode().decode("latin-1")]),
    "Authorization": st.sampled_from(["Bearer sk-a", "Bearer sk-b", "Basic Zm9v", "Bearer ", "sk-raw"]),
    "api-key": st.sampled_from(["sk-a", "sk-c"]),
})


def dumps(value) -> bytes:
    """JSON bytes of any generated value: orjson when it can, else the stdlib (ints beyond 64
    bits, NaN and infinities, which the stdlib writes as the invalid tokens NaN/Infinity)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode("utf-8", "surrogatepass")


@st.composite
def chat_bodies(draw):
    body = {"model": draw(MODEL), "messages": draw(st.one_of(st.lists(MESSAGE, max_size=8), st.lists(MESSAGE, min_size=1, max_size=3), JUNK))}
    for name, strategy in OPTIONAL_FIELDS.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(max_size=8))] = draw(JUNK)
    if draw(st.integers(0, 9)) == 0:
        del body[draw(st.sampled_from(["model", "messages"]))]
    return body


@st.composite
def agent_conversations(draw):
    """Mostly well-formed agent histories, bent where gateways break: orphan tool messages,
    duplicate tool call ids, unanswered calls, tool results in the wrong place, odd roles."""
    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(TEXT)})
    for _ in range(draw(st.integers(0, 6))):
        messages.append({"role": "user", "content": draw(CONTENT if draw(st.integers(0, 4)) == 0 else TEXT)})
        if draw(st.booleans()):
            ids = draw(st.lists(CALL_IDS, min_size=1, max_size=3))  # duplicates allowed on purpose
            calls = [{"id": i, "type": "function", "function": {"name": "read_file", "arguments": draw(st.sampled_from(["{}", "{\"target\": \"x\"}", "not json"]))}}
                     for i in ids]
            messages.append({"role": "assistant", "content": draw(st.one_of(st.none(), TEXT)), "tool_calls": calls})
            answered = draw(st.lists(st.sampled_from(ids + ["orphan_id"]), max_size=4))
            for call_id in answered:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": draw(TEXT)})
        if draw(st.booleans()):
            messages.append({"role": "assistant", "content": draw(TEXT)})
    if draw(st.integers(0, 5)) == 0:
        messages.insert(draw(st.integers(0, len(messages))), {"role": "tool", "tool_call_id": draw(CALL_IDS), "content": draw(TEXT)})
    messages.append({"role": "user", "content": draw(TEXT)})
    body = {"model": draw(st.sampled_from(["fake-32k", "fake-8k", "fake-32k"])), "messages": messages,
            "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["tools"] = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
    if draw(st.integers(0, 5)) == 0:
        body["n"] = draw(st.integers(1, 3))
    if draw(st.integers(0, 5)) == 0:
        body["stream_options"] = {"include_usage": True}
    return body


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@st.composite
def raw_bodies(draw):
    """Bytes that are not a valid JSON body, or barely are."""
    kind = draw(st.integers(0, 7))
    valid = dumps(draw(chat_bodies() if draw(st.booleans()) else agent_conversations()))
    if kind == 0:  # invalid UTF-8 spliced into a valid body
        at = draw(st.integers(0, len(valid)))
        return valid[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80"])) + valid[at:]
    if kind == 1:  # invalid UTF-8 inside a string value
        return b'{"model": "fake-32k", "messages": [{"role": "user", "content": "a\xff\xfe' + draw(st.binary(max_size=20)).replace(b'"', b"") + b'"}]}'
    if kind == 2:  # truncated
        return valid[: draw(st.integers(0, max(0, len(valid) - 1)))]
    if kind == 3:  # escaped lone surrogates and odd escapes
        escape = draw(st.sampled_from([r"\ud800", r"\udfff", r"\ud83d", r"\u0000", r"\uZZZZ", "\\", r"\x41"]))
        return b'{"model": "fake-32k", "messages": [{"role": "user", "content": "x' + escape.encode() + b'"}]}'
    if kind == 4:  # deep nesting, within and beyond the parser's limit
        depth = draw(st.sampled_from([10, 500, 1023, 1024, 1025, 5000, 100_000]))
        inner = b"[" * depth + b"]" * depth
        where = draw(st.sampled_from(["root", "content", "extra"]))
        if where == "root":
            return inner
        if where == "content":
            return b'{"model": "fake-32k", "messages": [{"role": "user", "content": ' + inner + b"}]}"
        return b'{"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}], "metadata": ' + inner + b"}"
    if kind == 5:
        return draw(st.binary(max_size=200))
    if kind == 6:  # any JSON document at all
        return dumps(draw(JSON_VALUES))
    # duplicate keys, trailing garbage, BOM, whitespace
    return draw(st.sampled_from([b"\xef\xbb\xbf", b"", b"  \n", b"{}", b"null"])) + valid + draw(
        st.sampled_from([b"", b" ", b"}", b"garbage", b"\x00", b',"model": 1}']))


# -- the corpus --------------------------------------------------------------------------------


def test_structured_bodies(corpus):
    @settings(FUZZ, max_examples=max(1, int(3600 * SCALE)))
    @given(chat_bodies(), HEADERS)
    def run(body, headers):
        corpus.post("/v1/chat/completions", dumps(body), headers)

    run()
    corpus.assert_clean("structured")


def test_agent_histories(corpus):
    @settings(FUZZ, max_examples=max(1, int(3000 * SCALE)))
    @given(agent_conversations(), HEADERS)
    def run(body, headers):
        corpus.post("/v1/chat/completions", dumps(body), headers)

    run()
    corpus.assert_clean("agent")


def test_raw_bytes(corpus):
    @settings(FUZZ, max_examples=max(1, int(2400 * SCALE)))
    @given(raw_bodies(), HEADERS)
    def run(body, headers):
        corpus.post("/v1/chat/completions", body, headers)

    run()
    corpus.assert_clean("raw")


def test_passthrough_routes(corpus):
    @settings(FUZZ, max_examples=max(1, int(700 * SCALE)))
    # The echo stream paced at 5 ms a line, not the puppet's default 50: still a stream of separate
    # chunks, without a quarter of a second per example (~20 s of the corpus).
    @given(st.sampled_from(["/v1/models", "/v1/models/fake-32k", "/v1/embeddings", "/v1/echo", "/v1/echo/stream?delay=0.005",
                            "/v1/echo/gzip", "/v1/responses", "/v1/files/x%00y", "/v1/../etc/passwd"]),
           st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]),
           st.one_of(raw_bodies(), st.builds(dumps, JSON_VALUES), st.just(b"")), HEADERS)
    def run(path, method, body, headers):
        corpus.post(path, body, headers, method=method)

    run()
    corpus.assert_clean("passthrough")


def test_compressed_request_bodies(corpus):
    """Content-Encoding on a request body: aiohttp decodes it for the gateway, so whatever goes
    upstream must not still claim to be gzip (nor carry the compressed length); undecodable
    bodies are the client's error (400), not the gateway's (500)."""
    import gzip

    plain = b'{"model": "fake-32k", "messages": [{"role": "user", "content": "zipped"}]}'
    zipped = gzip.compress(plain)
    headers = {"Content-Encoding": "gzip", "X-Session-Id": "zipped"}
    status, _, payload = corpus.http.request("POST", "/v1/chat/completions", zipped, {"Content-Type": "application/json", **headers})
    corpus.sent += 1
    assert status == 200, payload[:300]
    assert orjson.loads(payload)["choices"][0]["message"]["content"] == "ok: zipped"
    status, _, payload = corpus.http.request("POST", "/v1/echo", zipped, {"Content-Type": "application/json", **headers})
    corpus.sent += 1
    assert status == 200, payload[:300]
    assert orjson.loads(payload)["body_len"] == len(plain)  # the upstream got the body, whole and decodable
    status, _, payload = corpus.http.request("POST", "/v1/chat/completions", b"0123456789", {"Content-Type": "application/json", **headers})
    corpus.sent += 1
    assert status == 400 and _is_envelope(payload), (status, payload[:300])


def test_header_values_that_are_not_utf8(corpus):
    """aiohttp hands undecodable header bytes over as lone surrogates; identity and session ids
    must treat them as the client's error (or as opaque bytes), not crash on them (a 500)."""
    body = b'{"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}]}'
    failures = []
    for name in ("X-Session-Id", "Authorization", "api-key"):
        for value in (b"\xff\xfe", b"Bearer \xff\xfe", b"\xc3\x28", "ü".encode()):
            status, headers, payload = corpus.http.request("POST", "/v1/chat/completions", body,
                                                           {"Content-Type": "application/json", name: value})
            corpus.sent += 1
            if status >= 500 or (status >= 400 and not _is_envelope(payload)):
                failures.append((name, value, status, payload[:120]))
    assert not failures, failures


def _long_history(rounds: int = 30) -> list[dict]:
    """A valid agent session well over fake-8k's window: the gateway must compact it, offer its
    recall tools and (for RECALL: questions) run the recall loop."""
    messages: list[dict] = [{"role": "system", "content": "You are an agent."}]
    for r in range(rounds):
        messages.append({"role": "user", "content": f"Step {r}: read module {r}. [[call read_file {{}}]]"})
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_r{r}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_r{r}",
                         "content": f"module {r}: " + " ".join(f"value_{r}_{k}=DEP-{r}{k:03d}" for k in range(120))})
        messages.append({"role": "assistant", "content": f"Read module {r}."})
    return messages


LONG_HISTORY = _long_history()


def test_compacted_sessions_with_hostile_tails(corpus):
    """Junk appended to a session the gateway has to compact: projection, tailoring, summary
    jobs and the recall loop all see hostile messages, not just the parser."""

    plain = st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": TEXT}), max_size=2)},
                                  optional={"stream": st.booleans(), "n": st.integers(1, 3),
                                            "stream_options": st.just({"include_usage": True})})

    @settings(FUZZ, max_examples=max(1, int(400 * SCALE)))
    @given(st.one_of(agent_conversations(), plain), st.sampled_from(["fz-c1", "fz-c2", "fz-c3"]),
           st.one_of(st.none(), st.builds(lambda t: "RECALL: " + t, TEXT)))
    def run(tail, session, recall):
        messages = LONG_HISTORY + [m for m in tail["messages"] if m.get("role") not in ("system", "developer")]
        if recall is not None:
            messages.append({"role": "user", "content": recall})
        body = {**tail, "model": "fake-8k", "messages": messages}
        if body.get("stream_options") and not body.get("stream"):
            body["stream"] = True
        corpus.post("/v1/chat/completions", dumps(body), {"X-Session-Id": session})

    run()
    corpus.assert_clean("compacted")


def test_concurrent_branches_big_and_small_on_one_session(corpus):
    """Forty clients at once on one session, each on its own branch, some with bodies big enough
    to be parsed and projected off the event loop: the ledger is shared by the loop and worker
    threads, and must come out of it whole (checked after the corpus)."""
    from concurrent.futures import ThreadPoolExecutor

    big_output = "line of tool output with DEP-12345 and more words\n" * 14_000  # ~700 KB
    base = _long_history(12)

    def one(i: int) -> None:
        http = Http(corpus.rig.url)
        corpus.rig.lag.label = "concurrent branches"
        try:
            messages = base + [{"role": "user", "content": f"branch {i}: " + ("go on" if i % 4 else "RECALL: which DEP?")}]
            if i % 5 == 0:
                messages[-3] = {**messages[-3], "content": big_output}  # a big tool result on this branch
            body = dumps({"model": "fake-8k", "messages": messages, "stream": i % 2 == 0})
            for _ in range(3):
                status, headers, payload = http.request("POST", "/v1/chat/completions", body, {"X-Session-Id": "concurrent", "Content-Type": "application/json"})
                corpus.sent += 1
                corpus.check("/v1/chat/completions", status, headers, payload, body)
        finally:
            http.close()

    with ThreadPoolExecutor(max_workers=40) as pool:
        list(pool.map(one, range(40)))
    corpus.assert_clean("concurrent")


def test_big_bodies(corpus):
    """The sizes the issue names, a handful each: 10k messages, 10 MB single messages (plain,
    streaming, as parts, as a tool result), one of 20 MB, bodies over the size limit, and
    100k-deep JSON. The lag meter sees the gateway's loop while each is processed."""
    ten_mb = "word " * (2 * 1024 * 1024)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(10_001)]
    bodies = [
        {"model": "fake-32k", "messages": many},
        {"model": "fake-32k", "messages": many, "stream": True},
        {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}] * 10_000},
        {"model": "fake-32k", "messages": [{"role": "user", "content": ten_mb}]},
        {"model": "fake-32k", "messages": [{"role": "user", "content": ten_mb}], "stream": True},
        {"model": "fake-32k", "messages": [{"role": "user", "content": [{"type": "text", "text": ten_mb}]}]},
        {"model": "fake-32k", "messages": [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": ten_mb},
            {"role": "user", "content": "and?"}]},
    ]
    bodies.append({"model": "fake-32k", "messages": [{"role": "user", "content": ten_mb * 2}]})  # the 20 MB
    for i, body in enumerate(bodies):
        corpus.post("/v1/chat/completions", dumps(body), {"X-Session-Id": f"big-{i}"})
    over = b'{"model": "fake-32k", "messages": [{"role": "user", "content": "' + b"x" * (33 * 1024 * 1024) + b'"}]}'
    corpus.post("/v1/chat/completions", over, {"X-Session-Id": "big-over"})
    corpus.post("/v1/embeddings", over)
    corpus.post("/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert corpus.by_status.get(413, 0) >= 1, corpus.by_status
    corpus.assert_clean("big")


def test_nesting_that_can_be_read_but_not_written_is_a_400(corpus):
    """orjson reads 1024 levels and writes 254: between the two the gateway answered 500.
    (Arrays nested in ``content`` are a 400 at any depth: a content array holds part objects.)"""
    for depth in (100, 300, 1000):
        nested = b"[" * depth + b"]" * depth
        for body, fine in ((b'{"model": "fake-32k", "messages": [{"role": "user", "content": ' + nested + b"}]}", False),
                           (b'{"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}], "x_vendor_extension": '
                            + nested + b"}", depth == 100)):
            status, _, payload = corpus.http.request("POST", "/v1/chat/completions", body, {"X-Session-Id": "deep"})
            corpus.sent += 1
            assert status == (200 if fine else 400), (depth, payload[:200])
            assert status == 200 or _is_envelope(payload)


MALFORMED_FUNCTION = st.one_of(
    st.text(max_size=12), st.integers(), st.lists(st.text(max_size=4), max_size=2), st.booleans(),
    st.fixed_dictionaries({"name": st.one_of(st.integers(), st.lists(st.integers(), max_size=1), st.just({})),
                           "arguments": st.just("{}")}),
    st.fixed_dictionaries({"name": st.just("read_file"),
                           "arguments": st.one_of(st.integers(), st.just({"path": "a"}), st.lists(st.integers(), max_size=2))}),
)


def test_malformed_tool_calls_are_400(corpus):
    """A tool call whose `function` is not an object with string name and arguments (a string
    `function` was a 500: canonicalisation read it as a dict), in a well-formed agent history,
    streamed or not, on a fresh session and after a recorded turn."""
    def body(function, stream: bool, legacy: bool) -> dict:
        call = {"role": "assistant", "content": None, "function_call": function} if legacy else {
            "role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": function}]}
        answer = {"role": "function", "name": "read_file", "content": "x"} if legacy else {"role": "tool", "tool_call_id": "c1", "content": "x"}
        return {"model": "fake-32k", "stream": stream, "messages": [{"role": "user", "content": "read it"}, call, answer,
                                                                    {"role": "user", "content": "and?"}]}

    for function in ("read_file", 7, None, ["read_file"], {"name": 3, "arguments": "{}"}, {"name": "read_file", "arguments": {}}):
        for session in ("tc-fresh", "tc-fresh"):
            status, _, payload = corpus.http.request("POST", "/v1/chat/completions", dumps(body(function, False, False)),
                                                     {"Content-Type": "application/json", "X-Session-Id": session})
            corpus.sent += 1
            assert status == 400 and _is_envelope(payload), (function, status, payload[:200])

    @settings(FUZZ, max_examples=max(1, int(300 * SCALE)))
    @given(MALFORMED_FUNCTION, st.booleans(), st.booleans(), HEADERS)
    def run(function, stream, legacy, headers):
        if legacy and function is None:
            return
        corpus.post("/v1/chat/completions", dumps(body(function, stream, legacy)), headers)

    run()
    assert corpus.by_status.get(400, 0) > 0
    corpus.assert_clean("malformed tool calls")


# -- after the corpus --------------------------------------------------------------------------

CORPUS_TESTS = {"structured", "agent", "raw", "passthrough", "compacted", "big"}


def test_store_loop_and_count_after_the_corpus(corpus):
    rig = corpus.rig
    print(f"\nfuzz corpus: {corpus.sent:,} bodies, statuses {dict(sorted(corpus.by_status.items()))}, "
          f"upstream 5xx relayed {corpus.upstream_5xx}, worst gateway loop lag {rig.lag.worst:.3f} s "
          f"during {rig.lag.worst_label!r} (control loop worst {rig.control.worst:.3f} s)")
    if CORPUS_TESTS <= corpus.finished and SCALE >= 1:
        assert corpus.sent >= 10_000
    # A normal request still works, and is recorded.
    status, answer = corpus.http.json("POST", "/v1/chat/completions", {"model": "fake-32k", "messages": [
        {"role": "user", "content": "still alive?"}]}, {"X-Session-Id": "after-fuzz"})
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == "ok: still alive?"
    assert corpus.http.json("GET", "/healthz")[0] == 200
    rig.stop_gateway()
    # The store reads back: every session, every event, every branch's path to its root.
    ledger = Ledger(rig.store)
    try:
        sessions = ledger.sessions()
        assert any(s.session_id == "after-fuzz" for s in sessions)
        events = 0
        for record in sessions:
            stored = ledger.since(record.key, -1)
            events += len(stored)
            ids = {e.id for e in stored}
            for head in ledger.heads(record.key):
                path = ledger.path_to(record.key, head)
                assert path and path[0].parent is None, (record.key, head)
                assert all(e.id in ids for e in path)
        assert events > 0
    finally:
        ledger.close()
    for db_file in sorted(Path(rig.store).rglob("*.sqlite3")) + sorted(Path(rig.store).rglob("cache.db")):
        with sqlite3.connect(db_file) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", db_file
    # The target is no stall over 1 s; the assertion is more generous (STALL_BOUND_S), as
    # CPU work that takes 0.4 s on an idle core takes over 1 s on a CI runner shared four ways.
    over_target = rig.lag.own_stalls(rig.control, over=1.0)
    own = rig.lag.own_stalls(rig.control, over=STALL_BOUND_S)
    print(f"gateway loop stalls > 0.2 s: {len(rig.lag.stalls)}, control loop stalls: {len(rig.control.stalls)}, "
          f"gateway's own over the 1 s target: {over_target}")
    assert not own, f"the gateway's event loop stalled over {STALL_BOUND_S} s (label, lag, lag not explained by the machine): {own}"
