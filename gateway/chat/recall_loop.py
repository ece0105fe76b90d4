"""The recall loop (DESIGN §6): the gateway answers session_search / session_load itself.

When the view carries recall tools, the upstream's answer is inspected before the client sees
it. Recall calls are executed, appended (call and result, stored as side events) and the
upstream is called again, up to ``recall.max_rounds`` rounds, then once more without recall
tools. The client sees one answer: in streaming mode content deltas pass through as they come,
recall tool-call deltas never do, and the stream keeps one id with usage summed over every
upstream call of the turn. When one response mixes client and recall calls, the client's win.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from gateway.http.sse import SSEDecoder, StreamAssembler, encode_event
from gateway.http.upstream import response_headers
from policies import is_recall_call
from policies.messages import call_name

RECALL_CHOICE_KEYS = ("tool_choice", "parallel_tool_calls")


def _add_usage(total: dict | None, usage: dict | None) -> dict | None:
    if not usage:
        return total
    if total is None:
        return orjson.loads(orjson.dumps(usage))
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        total[key] = (total.get(key) or 0) + (usage.get(key) or 0)
    for group in ("prompt_tokens_details", "completion_tokens_details"):
        for key, value in (usage.get(group) or {}).items():
            if isinstance(value, int):
                bucket = total.setdefault(group, {})
                bucket[key] = (bucket.get(key) or 0) + value
    return total


class RecallLoop:
    def __init__(self, *, pipeline, tools, max_rounds: int, metrics) -> None:
        self.pipeline = pipeline
        self.tools = tools
        self.max_rounds = max_rounds
        self.metrics = metrics

    # -- shared ------------------------------------------------------------------------------

    def _body(self, turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        body = dict(turn.chat.body)
        body["messages"] = messages
        view = turn.view
        if with_recall:
            body["tools"] = view.tools
        else:
            client_tools = turn.chat.body.get("tools")
            if client_tools:
                body["tools"] = client_tools
            else:
                body.pop("tools", None)
                for key in RECALL_CHOICE_KEYS:
                    body.pop(key, None)
        if stream:
            # Usage of every call is needed to report the turn's total; the client's own
            # stream_options decide whether it is shown.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return orjson.dumps(body)

    def _split(self, calls: list[dict], names: tuple[str, str]) -> tuple[list[dict], list[dict]]:
        recall = [c for c in calls if is_recall_call(c, names)]
        client = [c for c in calls if not is_recall_call(c, names)]
        return recall, client

    async def _execute(self, turn, assistant: dict, recall_calls: list[dict]) -> list[dict]:
        names = turn.view.recall_names
        results = []
        for call in recall_calls:
            kind = "search" if call_name(call) == names[0] else "load"
            content = await self.tools.run(
                call, kind=kind, session_key=turn.ref.key, path_ids=turn.chat.ids, hidden=turn.view.hidden,
                matches=turn.recall_matches,
            )
            results.append({"role": "tool", "tool_call_id": call.get("id"), "content": content})
        turn.recall_calls += len(recall_calls)
        node = turn.chat.ids[-1] if turn.chat.ids else None
        try:
            self.pipeline.ledger.add_side_events(turn.ref, node, [assistant, *results])
            self.metrics.ledger_events.labels("side").inc(1 + len(results))
        except Exception:
            pass  # the recall still answers; the audit trail is best effort
        return results

    def _fit(self, turn, messages: list[dict]) -> list[dict]:
        """The grown view, fitted to the window again: recall results must never push a
        request over it. When nothing can make them fit, recall stops and the model answers
        from the view it had."""
        views = self.pipeline.views
        tools = turn.view.tools if turn.recall_rounds < self.max_rounds else turn.chat.body.get("tools")
        fitted = views.refit(turn.chat, messages, tools, turn.view.budget)
        if fitted is None:
            turn.recall_rounds = self.max_rounds
            return list(turn.view.messages)
        return fitted

    def _count_overhead(self, turn, usage: dict | None) -> None:
        """Every upstream call of a turn after the first exists because of recall: its tokens
        are the gateway's cost, set against the tokens it saved."""
        if usage and turn.recall_rounds > 0:
            spent = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
            self.metrics.tokens_spent_overhead.labels("recall").inc(spent)

    async def respond(self, request: web.Request, turn) -> web.StreamResponse:
        try:
            if turn.chat.stream:
                return await self._stream(request, turn)
            return await self._json(request, turn)
        finally:
            self.metrics.recall_rounds.observe(turn.recall_rounds)

    # -- non-streaming -----------------------------------------------------------------------

    async def _json(self, request: web.Request, turn) -> web.StreamResponse:
        pipeline = self.pipeline
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        usage_total: dict | None = None
        while True:
            with_recall = turn.recall_rounds < self.max_rounds
            body = self._body(turn, messages, with_recall, stream=False)
            t0 = time.perf_counter()
            async with pipeline.post_chat(request, body) as up:
                payload = await up.read()
                turn.timing.waiting(t0)
                headers = response_headers(up.headers, decoded=True)
                status, reason = up.status, up.reason
            if status != 200:
                return await self._send(request, turn, status, reason, payload, headers)
            try:
                data = orjson.loads(payload)
                message = data["choices"][0]["message"]
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
                return await self._send(request, turn, status, reason, payload, headers)
            usage_total = _add_usage(usage_total, data.get("usage"))
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
            turn.answer = data["choices"][0]["message"]
            turn.usage = usage_total
            return await self._send(request, turn, status, reason, orjson.dumps(data), headers, record=True)

    async def _send(self, request, turn, status, reason, payload, headers, record=False) -> web.StreamResponse:
        headers.update(turn.headers)
        headers["x-palimpsest-recall-calls"] = str(turn.recall_calls)
        response = web.Response(status=status, reason=reason, body=payload, headers=headers)
        await response.prepare(request)
        await response.write_eof()
        if record:
            self.pipeline._record(turn)
        return response

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: web.Request, turn) -> web.StreamResponse:
        pipeline = self.pipeline
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        want_usage = bool((turn.chat.body.get("stream_options") or {}).get("include_usage"))
        response: web.StreamResponse | None = None
        first: dict[str, Any] = {}
        usage_total: dict | None = None
        client_index: dict[int, int] = {}
        content_parts: list[str] = []
        client_calls: dict[int, dict] = {}
        while True:
            with_recall = turn.recall_rounds < self.max_rounds
            body = self._body(turn, messages, with_recall, stream=True)
            t0 = time.perf_counter()
            async with pipeline.post_chat(request, body) as up:
                turn.timing.waiting(t0)
                if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                    payload = await up.read()
                    if response is None:
                        return await self._send(request, turn, up.status, up.reason, payload, response_headers(up.headers, decoded=True))
                    # Mid-turn failure after the stream started: end it with an error event.
                    await response.write(encode_event({"error": {"message": "The upstream failed during recall.", "type": "upstream_error", "param": None, "code": str(up.status)}}))
                    await response.write(encode_event("[DONE]"))
                    await response.write_eof()
                    return response
                if response is None:
                    headers = response_headers(up.headers, decoded=True)
                    headers.update(turn.headers)
                    response = web.StreamResponse(status=200, headers=headers)
                    await response.prepare(request)
                decoder, assembler = SSEDecoder(), StreamAssembler()
                recall_idx: set[int] = set()
                finish: str | None = None
                call_usage = None
                while True:
                    t0 = time.perf_counter()
                    chunk = await up.content.readany()
                    turn.timing.waiting(t0)
                    if not chunk:
                        break
                    out = bytearray()
                    for data in decoder.feed(chunk):
                        if data == "[DONE]":
                            continue
                        try:
                            event = orjson.loads(data)
                        except orjson.JSONDecodeError:
                            continue
                        if not isinstance(event, dict):
                            continue
                        if not first:
                            first = {k: event.get(k) for k in ("id", "created", "model", "system_fingerprint")}
                        assembler.add(event)
                        if event.get("usage"):
                            call_usage = event["usage"]
                        forwarded = self._filter_chunk(event, first, names, recall_idx, client_index, client_calls, content_parts)
                        for choice in event.get("choices") or ():
                            if choice.get("index", 0) == 0 and choice.get("finish_reason"):
                                finish = choice["finish_reason"]
                        if forwarded is not None:
                            out += encode_event(forwarded)
                    if out:
                        await response.write(bytes(out))
            usage_total = _add_usage(usage_total, call_usage)
            self._count_overhead(turn, call_usage)
            calls = assembler.message().get("tool_calls") or []
            recall, client = self._split(calls, names)
            if recall and not client and with_recall:
                assistant = {"role": "assistant", "content": assembler.message().get("content"), "tool_calls": recall}
                results = await self._execute(turn, assistant, recall)
                turn.recall_rounds += 1
                messages = self._fit(turn, [*messages, assistant, *results])
                continue
            if finish == "tool_calls" and not client_calls:
                finish = "stop"
            tail = bytearray(encode_event({**first, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish or "stop"}]}))
            if want_usage and usage_total is not None:
                tail += encode_event({**first, "object": "chat.completion.chunk", "choices": [], "usage": usage_total})
            tail += encode_event("[DONE]")
            await response.write(bytes(tail))
            await response.write_eof()
            answer: dict[str, Any] = {"role": "assistant", "content": "".join(content_parts) or None}
            if client_calls:
                answer["tool_calls"] = [client_calls[i] for i in sorted(client_calls)]
            turn.answer = answer
            turn.usage = usage_total
            self.pipeline._record(turn)
            return response

    def _filter_chunk(self, event, first, names, recall_idx, client_index, client_calls, content_parts) -> dict | None:
        """The client's view of one upstream chunk: one id, no recall tool calls, no finish or
        usage (those are sent once, at the end of the turn)."""
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
            if kept_calls:
                delta["tool_calls"] = kept_calls
            if delta.get("content"):
                content_parts.append(delta["content"])
            has_payload = bool(delta.get("content") or kept_calls or delta.get("refusal") or (delta.get("role") and not content_parts and not client_calls))
            if has_payload:
                choices_out.append({**choice, "delta": delta, "finish_reason": None})
        if not choices_out:
            return None
        return {**event, **first, "choices": choices_out, "usage": None} if "usage" in event else {**event, **first, "choices": choices_out}
