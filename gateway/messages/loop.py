"""The recall loop for Anthropic Messages: the gateway answers session_search / session_load.

The chat loop's rules (``gateway/pipeline/recall_loop.py``) on Messages content blocks: when an
answer calls only recall tools (``stop_reason: tool_use``), the gateway runs them, appends the
assistant message as it came (thinking blocks with their signatures included, so they stay
bound to their calls) and a user message of ``tool_result`` blocks, and calls the upstream
again, up to ``recall.max_rounds``; then once more without recall tools. The client sees one
message: recall ``tool_use`` blocks never reach it, in JSON or in the stream
(``gateway/messages/stream.py`` renumbers the block indices), the first call's id names the
message and usage is summed. An answer that mixes client calls with recall calls goes to the
client without the recall calls.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from gateway.pipeline.recall_loop import RecallLoop
from gateway.pipeline.turn import Turn
from gateway.messages import adapter as fmt
from gateway.http.errors import GatewayError, UpstreamErrorEvent, UpstreamIncomplete, UpstreamUnreachable
from gateway.http.sse import SSEDecoder
from gateway.http.upstream import response_headers
from gateway.keys import UPSTREAM_KEY
from gateway.messages.pipeline import answer_of, end_stream_with_error, upstream_path
from gateway.messages.stream import MessageStreamFilter, add_usage, chat_usage, is_recall_block, visible_blocks
from policies.messages import tool_calls


class MessagesRecallLoop(RecallLoop):
    """``RecallLoop`` with Messages bodies, answers and streams."""

    def _body(self, turn: Turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        tools = turn.view.tools if with_recall else turn.chat.body.get("tools")
        body = fmt.render_body(turn.chat, messages, tools)
        if not with_recall and not turn.chat.body.get("tools"):
            body.pop("tools", None)
            body.pop("tool_choice", None)
        return orjson.dumps(body)

    def _open(self, turn: Turn, request: web.Request, body: bytes):
        return self.transport(turn.chat.model).post(upstream_path(request), request.headers, body, drop=self._drop,
                                                    tenant_key=request.get(UPSTREAM_KEY, ""))

    def _calls(self, blocks: list, names: tuple[str, str]) -> tuple[list[dict], bool]:
        """The recall calls of an answer (as neutral tool calls) and whether it also calls a
        client tool."""
        blocks = [b for b in blocks if isinstance(b, dict)]
        client = any(b.get("type") == "tool_use" and not is_recall_block(b, names) for b in blocks)
        calls = [c for c in tool_calls(fmt.assistant_item(blocks)) if c["function"]["name"] in names]
        return calls, client

    async def _recall_round(self, turn: Turn, messages: list[dict], blocks: list, calls: list[dict]) -> list[dict]:
        assistant = fmt.assistant_item([b for b in blocks if isinstance(b, dict)])
        results = await self._execute(turn, assistant, calls)
        turn.recall_rounds += 1
        return self._fit(turn, [*messages, assistant, *results])

    # -- non-streaming -----------------------------------------------------------------------

    async def _json(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        usage_total, first_id, shown = None, None, []
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
            except orjson.JSONDecodeError:
                data = None
            if not isinstance(data, dict) or not isinstance(data.get("content"), list):
                return await self._send(request, turn, status, reason, payload, headers)
            first_id = first_id or data.get("id")
            usage_total = add_usage(usage_total, data.get("usage"))
            self._count_overhead(turn, chat_usage(data.get("usage")))
            calls, client = self._calls(data["content"], names)
            if calls and not client and with_recall and data.get("stop_reason") == "tool_use":
                shown += visible_blocks(data["content"], names)
                messages = await self._recall_round(turn, messages, data["content"], calls)
                continue
            data["content"] = shown + visible_blocks(data["content"], names)
            if data.get("stop_reason") == "tool_use" and not any(b.get("type") == "tool_use" for b in data["content"]):
                data["stop_reason"] = "end_turn"
            if first_id:
                data["id"] = first_id
            if usage_total is not None:
                data["usage"] = {**(data.get("usage") or {}), **usage_total}
            turn.answer = answer_of(data)
            turn.usage = chat_usage(usage_total)
            return await self._send(request, turn, status, reason, orjson.dumps(data), headers, record=True)

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        relay = MessageStreamFilter(names)
        response: web.StreamResponse | None = None
        try:
            while True:
                with_recall = self._with_recall(turn)
                t0 = time.perf_counter()
                async with self._open(turn, request, self._body(turn, messages, with_recall, stream=True)) as up:
                    turn.timing.waiting(t0)
                    reader = self._reader(turn, up)
                    if up.status != 200 or "text/event-stream" not in up.headers.get("Content-Type", ""):
                        payload = await reader.read()
                        if response is None and with_recall and self._refused_tools(turn, up.status, payload):
                            turn.recall_refused = True
                            continue
                        if response is None:
                            return await self._send(request, turn, up.status, up.reason, payload,
                                                    response_headers(up.headers, decoded=True))
                        raise UpstreamUnreachable(f"The upstream answered {up.status} during recall.",
                                                  code=f"upstream_{up.status}")
                    self._refusal_confirmed(turn)
                    if response is None:
                        headers = response_headers(up.headers, decoded=True)
                        headers.update(turn.headers)
                        response = web.StreamResponse(status=200, headers=headers)
                        await response.prepare(request)
                    await self._relay_round(reader, turn, relay, response)
                round_ = relay.assembler
                if not round_.stopped:
                    raise UpstreamIncomplete("The upstream's stream ended before the message was complete.")
                self._count_overhead(turn, chat_usage(round_.usage))
                content = round_.content()
                calls, client = self._calls(content, names)
                recall_round = bool(calls) and not client and with_recall and round_.stop_reason == "tool_use"
                tail = relay.end_round(final=not recall_round)
                if recall_round:
                    messages = await self._recall_round(turn, messages, content, calls)
                    relay.new_round()
                    continue
                end = relay.finish()
                turn.answer = answer_of({"content": relay.visible, "stop_reason": round_.stop_reason})
                turn.usage = chat_usage(relay.usage)
                await self.recorder.answer(turn)  # durable before the client sees the end
                await response.write(tail + end)
                await response.write_eof()
                return response
        except GatewayError as exc:
            if response is None or not response.prepared:
                raise
            self.recorder.failed_in_stream(turn, exc)
            await end_stream_with_error(response, exc)
            return response

    async def _relay_round(self, reader, turn: Turn, relay: MessageStreamFilter, response) -> None:
        """One upstream stream through the filter, written to the client as it comes."""
        decoder = SSEDecoder()
        while True:
            t0 = time.perf_counter()
            chunk = await reader.chunk()
            turn.timing.waiting(t0)
            if not chunk:
                return
            out = bytearray()
            for data in decoder.feed(chunk):
                try:
                    event = orjson.loads(data)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "error":
                    if out:
                        await response.write(bytes(out))
                    raise UpstreamErrorEvent(event.get("error") if isinstance(event.get("error"), dict) else {})
                out += relay.feed(event)
            if out:
                await response.write(bytes(out))
