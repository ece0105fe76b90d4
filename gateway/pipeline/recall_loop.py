"""The recall loop (docs/architecture.md, "Recall"): the gateway answers session_search / session_load itself.

When the view carries recall tools, the upstream's answer is inspected before the client sees
it. Recall calls are executed, appended (call and result, stored as side events) and the
upstream is called again, up to ``recall.max_rounds`` rounds, then once more without recall
tools. The client sees one answer: in streaming mode content deltas pass through as they come,
recall tool-call deltas never do, and the stream keeps one id with usage summed over every
upstream call of the turn. When one response mixes client and recall calls, the client's win.

An upstream that refuses tools (an error naming them, on the turn's first call, for a client
that sent none) gets the same view again without recall tools, and that model is not offered
them again by this process (``RecallLoop.tool_less``); proactive recall still adds passages.

The loop answers requests for one choice; with ``n > 1`` the pipeline forwards the view
without recall tools (``body_without_recall``). An upstream failure after the client's stream
started (a later round's error status, a reset, a stall, a stream that ends without its
finish_reason) ends the stream with an error event, and the answer is not recorded; the
provider's own error event is told with its message, type and code. A stream that ends with
[DONE] but no finish_reason ends the client's the same way, without one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gateway.pipeline.turn import Turn, TurnRecorder, add_usage, clean_usage
from gateway.pipeline.views import ViewBuilder
from gateway.http.errors import GatewayError, UpstreamErrorEvent, UpstreamIncomplete, UpstreamUnreachable
from gateway.http.sse import SSEDecoder, StreamAssembler, ToolCallIndexer, encode_event, end_with_error, readable_chunk, readable_completion
from gateway.http.routing import Upstreams
from gateway.http.upstream import response_headers
from gateway.keys import UPSTREAM_KEY
from gateway.recall.auto import add_recalled_history
from policies import is_recall_call, last_user_index
from policies.messages import call_name

RECALL_CHOICE_KEYS = ("tool_choice", "parallel_tool_calls")
log = logging.getLogger("palimpsest.recall")


def _without_recall(turn: Turn, messages: list[dict]) -> dict:
    body = dict(turn.chat.body)
    body["messages"] = messages
    client_tools = turn.chat.body.get("tools")
    if client_tools:
        body["tools"] = client_tools
    else:
        body.pop("tools", None)
        for key in RECALL_CHOICE_KEYS:
            body.pop(key, None)
    return body


def body_without_recall(turn: Turn, messages: list[dict]) -> bytes:
    """The request body with `messages` and the client's own tools only."""
    return orjson.dumps(_without_recall(turn, messages))


@dataclass(slots=True)
class _Relay:
    """What the client has been sent so far in one streamed turn (across upstream calls)."""

    response: web.StreamResponse | None = None
    first: dict[str, Any] = field(default_factory=dict)  # id, created, model of the first chunk
    client_index: dict[int, int] = field(default_factory=dict)  # upstream tool index -> client's
    client_calls: dict[int, dict] = field(default_factory=dict)
    content_parts: list[str] = field(default_factory=list)
    answer: StreamAssembler = field(default_factory=StreamAssembler)  # what the client was sent, as a message


class RecallLoop:
    def __init__(self, *, upstream: Upstreams, session_header: str, views: ViewBuilder, tools, recorder: TurnRecorder,
                 max_rounds: int, metrics, transport=None) -> None:
        self.upstream = upstream
        # The upstream client for a model (``post``, ``post_chat``, ``reader``): the routed upstream,
        # or the format pipeline's (which may see it through Chat Completions).
        self.transport = transport or upstream.for_model
        self.views = views
        self.tools = tools
        self.recorder = recorder
        self.max_rounds = max_rounds
        self.metrics = metrics
        self._drop = frozenset({session_header.lower()})
        self.tool_less: set[str] = set()  # models whose upstream refused the recall tools (per process)

    # -- shared ------------------------------------------------------------------------------

    def _body(self, turn: Turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        if with_recall:
            body = dict(turn.chat.body)
            body["messages"] = messages
            body["tools"] = turn.view.tools
        else:
            body = _without_recall(turn, messages)
        if stream:
            # Usage of every call is needed to report the turn's total; the client's own
            # stream_options decide whether it is shown.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return orjson.dumps(body)

    def _open(self, turn: Turn, request: web.Request, body: bytes):
        """The upstream call of one round, to the upstream of the turn's model (a format's loop
        posts its own path)."""
        return self.transport(turn.chat.model).post_chat(request.headers, body, drop=self._drop,
                                                          tenant_key=request.get(UPSTREAM_KEY, ""))

    def _reader(self, turn: Turn, up):
        return self.transport(turn.chat.model).reader(up)

    async def _call_json(self, request: web.Request, turn: Turn, messages: list[dict], with_recall: bool):
        """One non-streaming round: (status, reason, payload, headers), or None when the
        upstream refused the recall tools (marked on the turn: the caller asks again)."""
        t0 = time.perf_counter()
        async with self._open(turn, request, self._body(turn, messages, with_recall, stream=False)) as up:
            payload = await self._reader(turn, up).read()
            turn.timing.waiting(t0)
            headers = response_headers(up.headers, decoded=True)
            status, reason = up.status, up.reason
        if status != 200 and with_recall and self._refused_tools(turn, status, payload):
            turn.recall_refused = True
            return None
        if status == 200:
            self._refusal_confirmed(turn)
        return status, reason, payload, headers

    def _split(self, calls: list[dict], names: tuple[str, str]) -> tuple[list[dict], list[dict]]:
        recall = [c for c in calls if is_recall_call(c, names)]
        client = [c for c in calls if not is_recall_call(c, names)]
        return recall, client

    async def _execute(self, turn: Turn, assistant: dict, recall_calls: list[dict]) -> list[dict]:
        names = turn.view.recall_names
        asking = last_user_index(turn.chat.history)
        results = []
        for call in recall_calls:
            kind = "search" if call_name(call) == names[0] else "load"
            content = await self.tools.run(
                call, kind=kind, session_key=turn.ref.key, path_ids=turn.chat.ids, hidden=turn.view.hidden,
                matches=turn.recall_matches, asking=turn.chat.ids[asking] if asking is not None else None,
            )
            results.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
        turn.recall_calls += len(recall_calls)
        await self.recorder.side_events(turn, [assistant, *results])
        return results

    def _fit(self, turn: Turn, messages: list[dict]) -> list[dict]:
        """The grown view, fitted to the window again: recall results must never push a
        request over it. When nothing can make them fit, recall stops and the model answers
        from the view it had."""
        tools = turn.view.tools if turn.recall_rounds < self.max_rounds else turn.chat.body.get("tools")
        fitted = self.views.refit(turn.chat, messages, tools, turn.view.budget)
        if fitted is None:
            turn.recall_rounds = self.max_rounds
            return list(turn.view.messages)
        return fitted

    def _count_overhead(self, turn: Turn, usage: dict | None) -> None:
        """Every upstream call of a turn after the first exists because of recall: its tokens
        are the gateway's cost, set against the tokens it saved."""
        usage = clean_usage(usage)
        if usage:
            billed = self.metrics.costs.call(turn.chat.model, turn.model_label,
                                             "recall" if turn.recall_rounds > 0 else "client", usage)
            turn.billed = billed if turn.billed is None else turn.billed + billed
            turn.answer_output = billed.output
        if usage and turn.recall_rounds > 0:
            spent = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
            self.metrics.tokens_spent_overhead.labels("recall").inc(spent)

    def _with_recall(self, turn: Turn) -> bool:
        return turn.recall_rounds < self.max_rounds and not turn.recall_refused

    def _refused_tools(self, turn: Turn, status: int, payload: bytes) -> bool:
        """Did the upstream refuse the request because of the recall tools the gateway added?
        (vLLM without --enable-auto-tool-choice, Ollama models without tool support and llama.cpp
        without --jinja answer any request carrying tools with an error naming them.) Only when
        the client sent no tools of its own, on the first call of the turn: then the same view
        is sent again without them, and the model is not offered recall tools again."""
        if turn.recall_rounds or turn.recall_refused or status < 400 or status in (401, 403, 404, 408, 429):
            return False
        if turn.chat.body.get("tools") or turn.chat.body.get("functions"):
            return False
        return b"tool" in payload[:4096].lower()

    def _refusal_confirmed(self, turn: Turn) -> None:
        """The view went through without recall tools after the upstream refused them."""
        model = turn.chat.model
        if turn.recall_refused and model not in self.tool_less:
            if len(self.tool_less) >= 1024:
                self.tool_less.clear()
            self.tool_less.add(model)
            log.warning("the upstream refused tools for a model: recall tools are no longer offered to it",
                        extra={"fields": {"model": model}})

    async def respond(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        await add_recalled_history(self.tools, self.views, turn)  # recall.auto_tokens (gateway/recall/auto.py)
        if turn.chat.model in self.tool_less and not (turn.chat.body.get("tools") or turn.chat.body.get("functions")):
            turn.recall_refused = True
        try:
            if turn.chat.stream:
                return await self._stream(request, turn)
            return await self._json(request, turn)
        finally:
            self.metrics.recall_rounds.observe(turn.recall_rounds)

    # -- non-streaming -----------------------------------------------------------------------

    async def _json(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        usage_total: dict | None = None
        while True:
            with_recall = self._with_recall(turn)
            call = await self._call_json(request, turn, messages, with_recall)
            if call is None:
                continue
            status, reason, payload, headers = call
            if status != 200:
                return await self._send(request, turn, status, reason, payload, headers)
            try:
                data = orjson.loads(payload)
                message = data["choices"][0]["message"]
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
                return await self._send(request, turn, status, reason, payload, headers)
            if not readable_completion(data):  # relayed as it came, like the plain relay would
                return await self._send(request, turn, status, reason, payload, headers)
            usage_total = add_usage(usage_total, data.get("usage"))
            self._count_overhead(turn, data.get("usage"))
            recall, client = self._split(message.get("tool_calls") or [], names)
            if recall and not client and with_recall:
                assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": recall}
                results = await self._execute(turn, assistant, recall)
                turn.recall_rounds += 1
                messages = self._fit(turn, [*messages, assistant, *results])
                continue
            for choice in data.get("choices") or ():
                msg = choice.get("message") or {}
                calls = msg.get("tool_calls")
                if calls:
                    kept = [c for c in calls if not is_recall_call(c, names)]
                    if kept:
                        msg["tool_calls"] = kept
                    else:
                        msg.pop("tool_calls", None)
                        if choice.get("finish_reason") == "tool_calls":
                            choice["finish_reason"] = "stop"
            if usage_total is not None:
                data["usage"] = usage_total
            if data["choices"][0].get("finish_reason"):
                turn.answer = message
            turn.usage = usage_total
            return await self._send(request, turn, status, reason, orjson.dumps(data), headers, record=True)

    async def _send(self, request, turn, status, reason, payload, headers, record=False) -> web.StreamResponse:
        headers.update(turn.headers)
        headers["x-palimpsest-recall-calls"] = str(turn.recall_calls)
        if turn.billed is not None and turn.usage is not None:
            headers["x-palimpsest-cached-tokens"] = str(turn.billed.cached)
        response = web.Response(status=status, reason=reason, body=payload, headers=headers)
        if record:
            await self.record(turn)  # durable before the client has it
        await response.prepare(request)
        await response.write_eof()
        return response

    async def record(self, turn: Turn) -> None:
        """The complete answer into the ledger (a format's loop may remember more, e.g. its id)."""
        await self.recorder.answer(turn)

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        relay = _Relay()
        try:
            return await self._stream_rounds(request, turn, relay)
        except GatewayError as exc:
            if relay.response is None or not relay.response.prepared:
                raise
            self.recorder.failed_in_stream(turn, exc)
            await end_with_error(relay.response, exc)
            return relay.response

    async def _stream_rounds(self, request: web.Request, turn: Turn, relay: "_Relay") -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        want_usage = bool((turn.chat.body.get("stream_options") or {}).get("include_usage"))
        usage_total: dict | None = None
        while True:
            with_recall = self._with_recall(turn)
            body = self._body(turn, messages, with_recall, stream=True)
            t0 = time.perf_counter()
            async with self._open(turn, request, body) as up:
                turn.timing.waiting(t0)
                reader = self._reader(turn, up)
                if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                    payload = await reader.read()
                    if relay.response is None and with_recall and self._refused_tools(turn, up.status, payload):
                        turn.recall_refused = True
                        continue
                    if relay.response is None:
                        return await self._send(request, turn, up.status, up.reason, payload, response_headers(up.headers, decoded=True))
                    raise UpstreamUnreachable(f"The upstream answered {up.status} during recall.", code=f"upstream_{up.status}")
                self._refusal_confirmed(turn)
                if relay.response is None:
                    headers = response_headers(up.headers, decoded=True)
                    headers.update(turn.headers)
                    relay.response = web.StreamResponse(status=200, headers=headers)
                    await relay.response.prepare(request)
                assembler, finish, call_usage = await self._relay_round(reader, turn, relay, names)
            if finish is None and not assembler.done:
                raise UpstreamIncomplete("The upstream's stream ended before the answer was complete.")
            usage_total = add_usage(usage_total, call_usage)
            self._count_overhead(turn, call_usage)
            calls = assembler.message().get("tool_calls") or []
            recall, client = self._split(calls, names)
            if recall and not client and with_recall and finish is not None:
                assistant = {"role": "assistant", "content": assembler.message().get("content"), "tool_calls": recall}
                results = await self._execute(turn, assistant, recall)
                turn.recall_rounds += 1
                messages = self._fit(turn, [*messages, assistant, *results])
                continue
            if finish == "tool_calls" and not relay.client_calls:
                finish = "stop"
            answer = relay.answer.message()  # content, refusal, a legacy function_call: as the client got them
            answer.pop("tool_calls", None)
            answer["content"] = "".join(relay.content_parts) or None
            if relay.client_calls:
                answer["tool_calls"] = [relay.client_calls[i] for i in sorted(relay.client_calls)]
            if finish is not None or answer.get("content") or len(answer) > 2:  # [DONE] alone: only an answer with something in it
                turn.answer = answer
            turn.usage = usage_total
            await self.recorder.answer(turn)  # durable before the client sees the end of the answer
            first = relay.first
            # A provider that ended with [DONE] but named no finish_reason gets none invented.
            tail = bytearray(encode_event({**first, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
                             if finish is not None else b"")
            if want_usage and usage_total is not None:
                tail += encode_event({**first, "object": "chat.completion.chunk", "choices": [], "usage": usage_total})
            tail += encode_event("[DONE]")
            await relay.response.write(bytes(tail))
            await relay.response.write_eof()
            return relay.response

    async def _relay_round(self, reader, turn: Turn, relay: "_Relay", names) -> tuple[StreamAssembler, str | None, dict | None]:
        """Relay one upstream stream's chunks as the client's view of them; returns the
        rebuilt message, choice 0's finish_reason (None: the stream ended early) and usage."""
        decoder, assembler, indexer = SSEDecoder(), StreamAssembler(), ToolCallIndexer()
        recall_idx: set[int] = set()
        finish: str | None = None
        call_usage = None
        while True:
            t0 = time.perf_counter()
            chunk = await reader.chunk()
            turn.timing.waiting(t0)
            if not chunk:
                return assembler, finish, call_usage
            out = bytearray()
            for data in decoder.feed(chunk):
                if data == "[DONE]":
                    assembler.done = True
                    continue
                try:
                    event = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(event, dict) or not readable_chunk(event):
                    continue  # what the gateway cannot read it cannot rewrite: left out, the stream goes on
                if isinstance(event.get("error"), dict) and not event.get("choices"):
                    if out:
                        await relay.response.write(bytes(out))
                    raise UpstreamErrorEvent(event["error"])  # told to the client as the provider said it
                if not relay.first:
                    relay.first = {k: event.get(k) for k in ("id", "created", "model", "system_fingerprint")}
                indexer.number(event)  # tool-call deltas without an index get one: the assembler's and the client's
                assembler.add(event)
                if event.get("usage"):
                    call_usage = event["usage"]
                forwarded = self._filter_chunk(event, relay, names, recall_idx)
                for choice in event.get("choices") or ():
                    if choice.get("index", 0) == 0 and choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                if forwarded is not None:
                    out += encode_event(forwarded)
            if out:
                await relay.response.write(bytes(out))

    def _filter_chunk(self, event, relay: "_Relay", names, recall_idx) -> dict | None:
        """The client's view of one upstream chunk: one id, no recall tool calls, no finish or
        usage (those are sent once, at the end of the turn). Everything else a delta carries
        (a legacy function_call, a refusal, reasoning text, audio) reaches the client."""
        first, client_index, client_calls, content_parts = relay.first, relay.client_index, relay.client_calls, relay.content_parts
        choices_out = []
        for choice in event.get("choices") or ():
            delta = dict(choice.get("delta") or {})
            calls = delta.pop("tool_calls", None) or []
            kept_calls = []
            for call in calls:
                idx = call.get("index", 0)
                name = ((call.get("function") or {}).get("name")) or ""
                if idx in recall_idx:
                    continue
                if idx not in client_index:
                    if name and name in names:
                        recall_idx.add(idx)
                        continue
                    client_index[idx] = len(client_index)
                mapped = {**call, "index": client_index[idx]}
                kept_calls.append(mapped)
                slot = client_calls.setdefault(client_index[idx], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
                slot.update((k, v) for k, v in call.items() if k not in ("index", "id", "type", "function") and v is not None)
            if kept_calls:
                delta["tool_calls"] = kept_calls
            if delta.get("content"):
                content_parts.append(delta["content"])
            if choice.get("index", 0) == 0:
                relay.answer.add({"choices": [{"delta": {k: v for k, v in delta.items() if k not in ("content", "tool_calls")}}]})
            others = any(v for k, v in delta.items() if k not in ("role", "content", "tool_calls"))
            has_payload = bool(delta.get("content") or kept_calls or others or (delta.get("role") and not content_parts and not client_calls))
            if has_payload:
                choices_out.append({**choice, "delta": delta, "finish_reason": None})
        if not choices_out:
            return None
        return {**event, **first, "choices": choices_out, "usage": None} if "usage" in event else {**event, **first, "choices": choices_out}
