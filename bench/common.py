"""Shared harness of the compaction and recall benchmarks (bench/compaction.py, bench/recall.py).

Everything runs in ONE process on loopback ports: the SIMULATED upstream (``simulator.puppet``,
never a real provider) and a real gateway app (``gateway.app.create_app``) served by aiohttp as
tests/conftest.py does, so the benchmarks can read the puppet's log (``RECEIVED``) and the
gateway's internals (ledger, index, summarizer) directly.

The puppet gets one extra middleware, outermost, added here rather than in gateway/puppet.py:
it records the status and ``usage`` of every chat completion it answers (summary calls
included, which the client never sees) and can delay summary calls only
(``x-palimpsest-purpose: summary``) by a fixed time, to measure what sync compaction costs a
user when each summary call takes, say, 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.app import create_app  # noqa: E402
from simulator.puppet import PUPPET_STATE, RECEIVED, count_prompt, create_puppet_app  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from gateway.keys import INDEXER, LEDGER, METRICS, SUMMARIZER  # noqa: E402
from store.ledger import SessionRef  # noqa: E402

MODEL = "fake-32k"
WINDOW = 32_000
API_KEY = "sk-bench-not-a-real-key"
LONGMEMEVAL = "/work/shared/data/longmemeval"
PURPOSE = "x-palimpsest-purpose"

__all__ = [
    "API_KEY", "MODEL", "WINDOW", "Bench", "Call", "Client", "Reply", "count_prompt",
    "flatten_haystack", "fmt", "load_cases", "machine_note", "percentile", "prefix_stats",
    "quiet_logs", "replay", "Sent", "answer_text", "set_loop_policy",
]


# --- small helpers -----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    data = sorted(v for v in values if v == v)
    if not data:
        return float("nan")
    k = (len(data) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def machine_note() -> str:
    return (f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; puppet, gateway "
            "and client share one process and event loop")


def quiet_logs() -> None:
    """The gateway logs summary retries etc. at WARNING; the benchmark reads metrics instead."""
    logging.getLogger("palimpsest").setLevel(logging.ERROR)
    logging.getLogger("aiohttp").setLevel(logging.ERROR)


def set_loop_policy() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_and_report(run, render, args) -> None:
    """Run a benchmark's `run(args)` on the fast loop, print `render(result)`, and write the
    result (with the arguments) as JSON when `--json` was given."""
    set_loop_policy()
    result = asyncio.run(run(args))
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **result},
                                        indent=2, default=str))


def load_cases(limit: int | None = None, *, skip_abstention: bool = True) -> list[dict]:
    """LongMemEval-S cases, sorted by file name (deterministic); `_abs` (abstention) cases have
    no evidence turn and are skipped by default."""
    paths = sorted(glob.glob(f"{LONGMEMEVAL}/*.json"))
    if skip_abstention:
        paths = [p for p in paths if not Path(p).stem.endswith("_abs")]
    cases = []
    for path in paths[: limit if limit else None]:
        case = json.loads(Path(path).read_text())
        case["_file"] = Path(path).name
        cases.append(case)
    return cases


HAYSTACK_SYSTEM = "You are a helpful assistant with a long memory of your conversations with this user."


def flatten_haystack(case: dict) -> tuple[list[dict], list[str]]:
    """The haystack as one chat history (system + every turn, in order) and the evidence texts
    (contents of the turns marked has_answer). Consecutive turns of one role are kept as they
    are: the puppet, like OpenAI, accepts them."""
    messages = [{"role": "system", "content": HAYSTACK_SYSTEM}]
    evidence = []
    for session in case["haystack_sessions"]:
        for turn in session:
            messages.append({"role": turn["role"], "content": turn["content"]})
            if turn.get("has_answer"):
                evidence.append(turn["content"])
    return messages, evidence


# --- the prefix a provider cache could reuse ---------------------------------------------------


def _message_keys(messages: list[dict]) -> list[tuple[bytes, int]]:
    from simulator.puppet import count_message

    return [(orjson.dumps(m, option=orjson.OPT_SORT_KEYS), count_message(m)) for m in messages]


def prefix_stats(bodies: list[dict]) -> dict[str, float]:
    """Prefix stability over consecutive upstream prompts of one session.

    For each prompt after the first: the leading messages identical to the previous prompt's
    (same position, same JSON). ``cur_share``: their tokens / the current prompt's tokens (what
    a provider prompt cache could serve); ``prev_kept``: their tokens / the previous prompt's
    tokens (how much of the previous prompt survived unchanged); ``msg_share``: the same as
    cur_share counted in messages. Tools are compared too: a changed tool list breaks the cache
    of everything (OpenAI puts tools first), so it counts as zero shared.
    """
    cur_shares, prev_kept, msg_shares = [], [], []
    previous: list[tuple[bytes, int]] | None = None
    previous_tools = None
    for body in bodies:
        keyed = _message_keys(body["messages"])
        tools = orjson.dumps(body.get("tools"), option=orjson.OPT_SORT_KEYS)
        if previous is not None:
            shared_tokens = shared_msgs = 0
            if tools == previous_tools:
                for (key, tokens), (before, _) in zip(keyed, previous):
                    if key != before:
                        break
                    shared_tokens += tokens
                    shared_msgs += 1
            total = sum(t for _, t in keyed) or 1
            cur_shares.append(shared_tokens / total)
            prev_kept.append(shared_tokens / (sum(t for _, t in previous) or 1))
            msg_shares.append(shared_msgs / max(1, len(keyed)))
        previous, previous_tools = keyed, tools
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"cur_share": mean(cur_shares), "prev_kept": mean(prev_kept), "msg_share": mean(msg_shares),
            "pairs": len(cur_shares)}


# --- the puppet, with a recording / delaying middleware ----------------------------------------


@dataclass
class Call:
    """One chat completion the puppet answered (as its middleware saw it)."""

    purpose: str  # "summary" or "" (a request the gateway forwarded or the client sent)
    status: int
    usage: dict | None
    started: float
    elapsed: float
    index: int  # position of the request in RECEIVED at arrival (for matching)


@dataclass
class Puppet:
    app: web.Application
    runner: web.AppRunner
    base_url: str
    calls: list[Call] = field(default_factory=list)
    summary_delay_s: float = 0.0
    answer_delay_s: float = 0.0  # delay of every other chat completion (model "thinking")

    @property
    def received(self) -> list[dict]:
        return self.app[RECEIVED]

    def chat_requests(self) -> list[dict]:
        return [r for r in self.received if r["path"].endswith("/chat/completions")]

    def reset(self, *, cache: bool = True) -> None:
        """Forget the log (bounded memory between sessions) and, unless `cache` is False (the
        same session goes on), the simulated prompt cache."""
        self.received.clear()
        self.calls.clear()
        if cache:
            self.app[PUPPET_STATE].prompt_cache.clear()


def _recording_middleware(puppet_ref: list[Puppet]):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if not request.path.endswith("/chat/completions"):
            return await handler(request)
        puppet = puppet_ref[0]
        purpose = request.headers.get(PURPOSE, "").lower()
        if purpose == "summary" and puppet.summary_delay_s:
            await asyncio.sleep(puppet.summary_delay_s)
        elif purpose != "summary" and puppet.answer_delay_s:
            await asyncio.sleep(puppet.answer_delay_s)
        started = time.perf_counter()
        index = len(puppet.received)
        response = await handler(request)
        usage = None
        body = getattr(response, "body", None)
        if isinstance(body, (bytes, bytearray)) and response.status == 200:
            with contextlib.suppress(Exception):
                usage = orjson.loads(body).get("usage")
        puppet.calls.append(Call(purpose, response.status, usage, started,
                                 time.perf_counter() - started, index))
        return response

    return middleware


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def start_puppet(*, windows: dict[str, int] | None = None, summary_delay_s: float = 0.0,
                       latency_s: float = 0.0) -> Puppet:
    ref: list[Puppet] = []
    app = create_puppet_app(windows=windows or {MODEL: WINDOW}, latency_s=latency_s)
    app.middlewares.insert(0, _recording_middleware(ref))  # outermost: sees final statuses
    runner, port = await _serve(app)
    puppet = Puppet(app, runner, f"http://127.0.0.1:{port}/v1", summary_delay_s=summary_delay_s)
    ref.append(puppet)
    return puppet


# --- the gateway -------------------------------------------------------------------------------


@dataclass
class Gateway:
    app: web.Application
    runner: web.AppRunner
    base_url: str
    store: Path

    def session_key(self, session_id: str) -> str | None:
        for record in self.app[LEDGER].sessions():
            if record.session_id == session_id:
                return record.key
        return None

    async def index(self):
        """The recall search index (store.index.SearchIndex), opened if need be."""
        return await self.app[INDEXER].opened()

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the samples of metric `name` (optionally filtered by labels)."""
        total = 0.0
        for family in self.app[METRICS].registry.collect():
            for sample in family.samples:
                if sample.name != name:
                    continue
                if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                total += sample.value
        return total

    async def settle(self, timeout: float = 300.0) -> float:
        """Wait until no summary job is queued or running and background indexing is idle;
        returns the seconds waited."""
        summarizer = self.app[SUMMARIZER]
        indexer = self.app[INDEXER]
        started = time.perf_counter()
        quiet = 0
        while time.perf_counter() - started < timeout:
            busy = (summarizer._running or not summarizer._queue.empty() or summarizer._queued
                    or indexer._pending)
            quiet = 0 if busy else quiet + 1
            if quiet >= 3:  # idle for three polls in a row (a job may enqueue another)
                break
            await asyncio.sleep(0.02)
        return time.perf_counter() - started


async def start_gateway(upstream_url: str, store: Path, **sections: Any) -> Gateway:
    sections.setdefault("models", {MODEL: {"context_window": WINDOW}})
    sections["upstream"] = {"base_url": upstream_url, "api_key": API_KEY, **sections.get("upstream", {})}
    sections["store"] = {"path": str(store), **sections.get("store", {})}
    sections.setdefault("log", {"level": "ERROR"})
    # One benchmark client on loopback: no client keys (they would only add a 401 path here).
    sections["server"] = {"client_keys": "off", **sections.get("server", {})}
    settings = load_settings(None, **sections)
    app = create_app(settings)
    runner, port = await _serve(app)
    return Gateway(app, runner, f"http://127.0.0.1:{port}/v1", store)


@dataclass
class Bench:
    """A puppet and (optionally) a gateway in front of it, in a temporary directory."""

    puppet: Puppet
    gateway: Gateway | None
    work: Path

    @classmethod
    async def start(cls, *, gateway: bool = True, summary_delay_s: float = 0.0, **sections: Any) -> "Bench":
        work = Path(tempfile.mkdtemp(prefix="palimpsest-bench-"))
        puppet = await start_puppet(summary_delay_s=summary_delay_s)
        gw = await start_gateway(puppet.base_url, work / "store", **sections) if gateway else None
        return cls(puppet, gw, work)

    async def stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.runner.cleanup()
        await self.puppet.runner.cleanup()
        shutil.rmtree(self.work, ignore_errors=True)

    def session_ref(self, session_id: str) -> SessionRef | None:
        key = self.gateway.session_key(session_id) if self.gateway else None
        if key is None:
            return None
        return SessionRef(key.split("/", 1)[0], session_id)


# --- the client --------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    body: dict | None  # the completion (non-streaming) or the assembled message (streaming)
    headers: dict[str, str]
    elapsed: float
    message: dict | None = None  # choices[0].message, as the client keeps it in its history
    error: str = ""
    chunks: list[dict] = field(default_factory=list)  # streaming: every SSE event


class Client:
    """An agent client on aiohttp (cheaper than the openai SDK, same wire format)."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0) -> None:
        self.base_url = base_url
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                          connector=aiohttp.TCPConnector(limit=16))

    async def close(self) -> None:
        await self.http.close()

    async def chat(self, body: dict, session_id: str | None = None) -> Reply:
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        if session_id:
            headers["X-Session-Id"] = session_id
        started = time.perf_counter()
        async with self.http.post(f"{self.base_url}/chat/completions", data=orjson.dumps(body),
                                  headers=headers) as response:
            if body.get("stream") and response.status == 200:
                return await self._stream(response, started)
            payload = await response.read()
            elapsed = time.perf_counter() - started
            hdrs = {k.lower(): v for k, v in response.headers.items()}
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            data = None
        if response.status != 200 or not isinstance(data, dict) or "choices" not in data:
            err = ((data or {}).get("error") or {}) if isinstance(data, dict) else {}
            return Reply(response.status, data, hdrs, elapsed,
                         error=str(err.get("code") or err.get("message") or payload[:120]))
        message = {k: v for k, v in data["choices"][0]["message"].items() if v is not None}
        return Reply(response.status, data, hdrs, elapsed, message)

    async def _stream(self, response: aiohttp.ClientResponse, started: float) -> Reply:
        hdrs = {k.lower(): v for k, v in response.headers.items()}
        chunks: list[dict] = []
        buffer = b""
        async for raw in response.content.iter_any():
            buffer += raw
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data: ") and line[6:] != b"[DONE]":
                        with contextlib.suppress(orjson.JSONDecodeError):
                            chunks.append(orjson.loads(line[6:]))
        elapsed = time.perf_counter() - started
        content, calls, error = [], {}, ""
        for chunk in chunks:
            if "error" in chunk:
                error = str(chunk["error"].get("code") or chunk["error"].get("message"))
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    content.append(delta["content"])
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                                   "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.get("id") or slot["id"]
                    fn = call.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
        message: dict = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        message = {k: v for k, v in message.items() if v is not None}
        return Reply(200, message, hdrs, elapsed, message, error=error, chunks=chunks)


def answer_text(reply: Reply) -> str:
    content = (reply.message or {}).get("content") or ""
    return content[len("ANSWER:"):].strip() if content.startswith("ANSWER:") else content



# --- replaying a synthetic agent session ------------------------------------------------------


@dataclass
class Sent:
    """One request the client sent, with what it cost and what came back."""

    reply: Reply
    client_tokens: int  # count_prompt of the body the client sent (the puppet's own counter)
    round: int
    step: str  # "call" (expects a tool call) or "answer" (after the tool result)
    body: dict | None = None  # the body as sent (its own message list), for bench/billing.py


async def replay(client: Client, session, session_id: str | None, *, model: str = MODEL,
                 rounds: int | None = None, history: list[dict] | None = None,
                 tools: list[dict] | None = None) -> tuple[list[dict], list[Sent]]:
    """Play a simulator.workloads.SyntheticSession as tests/support/agent.py does (2 requests per
    round: the tool call, then the answer after the tool result), but keep going after a
    rejection, as a client that ignores errors would: a rejected first request leaves the user
    turn in the history and the round ends (no tool call came back); a rejected second request
    leaves the tool call and its result without an answer."""
    from simulator.workloads import TOOL_SPECS

    tools = TOOL_SPECS if tools is None else tools
    history = history if history is not None else [{"role": "system", "content": session.system}]
    sent: list[Sent] = []
    for r, spec in enumerate(session.rounds[: rounds if rounds is not None else len(session.rounds)]):
        history.append({"role": "user", "content": spec["user"]})
        body = {"model": model, "messages": history, "tools": tools}
        tokens = count_prompt(body)
        first = await client.chat(body, session_id)
        sent.append(Sent(first, tokens, r, "call", {**body, "messages": list(history)}))
        if first.status != 200 or not (first.message or {}).get("tool_calls"):
            if first.message is not None:
                history.append(first.message)
            continue
        history.append(first.message)
        history.append({"role": "tool", "tool_call_id": first.message["tool_calls"][0]["id"],
                        "content": spec["output"]})
        body = {"model": model, "messages": history, "tools": tools}
        tokens = count_prompt(body)
        second = await client.chat(body, session_id)
        sent.append(Sent(second, tokens, r, "answer", {**body, "messages": list(history)}))
        if second.message is not None:
            history.append(second.message)
    return history, sent


async def replay_loop(client: Client, session, session_id: str | None, *, model: str = MODEL,
                      tools: list[dict] | None = None) -> tuple[list[dict], list[Sent]]:
    """Play a simulator.workloads.AgentLoopSession as tests/support/agent.py drive_loop does (one
    user message per turn, then a request after every tool result until a text answer), but keep
    going after a rejection: a rejected request ends its turn (no tool call came back)."""
    from simulator.workloads import TOOL_SPECS

    tools = TOOL_SPECS if tools is None else tools
    history = [{"role": "system", "content": session.system}]
    sent: list[Sent] = []
    for t, turn in enumerate(session.turns):
        history.append({"role": "user", "content": turn["user"]})
        steps = iter(turn["steps"])
        while True:
            body = {"model": model, "messages": history, "tools": tools}
            reply = await client.chat(body, session_id)
            sent.append(Sent(reply, count_prompt(body), t, "loop", {**body, "messages": list(history)}))
            if reply.status != 200 or reply.message is None:
                break
            history.append(reply.message)
            step = next(steps, None)
            if not reply.message.get("tool_calls") or step is None:
                break
            history.append({"role": "tool", "tool_call_id": reply.message["tool_calls"][0]["id"],
                            "content": step["output"]})
    return history, sent
