"""The recall loop for the Responses API: the gateway answers session_search / session_load.

The chat loop's rules (``gateway/pipeline/recall_loop.py``) on Responses items: when a response's
output calls only recall tools, the gateway runs them, appends the output items (reasoning
included, so it stays bound to its calls) and ``function_call_output`` items, and calls the
upstream again, up to ``recall.max_rounds``; then once more without recall tools. The client
sees one response: recall calls never reach it, in JSON or in the stream
(``gateway/responses/stream.py`` renumbers ``output_index`` and ``sequence_number``), usage is
summed, and the first call's id names the response. A response that mixes client calls with
recall calls goes to the client without the recall calls.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from gateway.pipeline.recall_loop import RecallLoop
from gateway.pipeline.turn import Turn
from gateway.responses import adapter as fmt
from gateway.http.errors import GatewayError, UpstreamErrorEvent, UpstreamIncomplete, UpstreamUnreachable
from gateway.http.sse import SSEDecoder
from gateway.http.upstream import response_headers
from gateway.keys import UPSTREAM_KEY
from gateway.responses.pipeline import PATH, answer_of, chat_usage, end_stream_with_error
from gateway.responses.stream import TERMINAL, ResponseStreamFilter, add_usage, as_sent, is_recall_item, visible_output
from policies.messages import tool_calls


class ResponsesRecallLoop(RecallLoop):
    """``RecallLoop`` with Responses bodies, answers and streams; ``record`` is the pipeline's
    (the answer into the ledger, its response id remembered)."""

    def __init__(self, *, record, **kw) -> None:
        super().__init__(**kw)  # transport: ResponsesPipeline.transport, the upstream or it through chat
        self.record = record  # ResponsesPipeline.record: the answer into the ledger, its id remembered

    def _body(self, turn: Turn, messages: list[dict], with_recall: bool, stream: bool) -> bytes:
        tools = turn.view.tools if with_recall else turn.chat.body.get("tools")
        body = fmt.render_body(turn.chat, messages, tools)
        if not with_recall and not turn.chat.body.get("tools"):
            for key in ("tools", "tool_choice", "parallel_tool_calls"):
                body.pop(key, None)
        return orjson.dumps(body)

    def _open(self, turn: Turn, request: web.Request, body: bytes):
        return self.transport(turn.chat.model).post(PATH, request.headers, body, drop=self._drop,
                                                    tenant_key=request.get(UPSTREAM_KEY, ""))

    def _calls(self, output: list, names: tuple[str, str]) -> tuple[list[dict], bool]:
        """The recall calls of an output (as neutral tool calls) and whether it also calls a
        client tool."""
        assistant = fmt.assistant_item([i for i in output if isinstance(i, dict)])
        client = any(isinstance(i, dict) and fmt.is_call(i) and not is_recall_item(i, names) for i in output)
        calls = [c for c in tool_calls(assistant) if c["function"]["name"] in names]
        return calls, client

    async def _recall_round(self, turn: Turn, messages: list[dict], output: list, calls: list[dict]) -> list[dict]:
        assistant = fmt.assistant_item([i for i in output if isinstance(i, dict)])
        results = await self._execute(turn, assistant, calls)
        turn.recall_rounds += 1
        return self._fit(turn, [*messages, assistant, *results])

    # -- non-streaming -----------------------------------------------------------------------

    async def _json(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        usage_total, first_id = None, None
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
            if not isinstance(data, dict) or not isinstance(data.get("output"), list):
                return await self._send(request, turn, status, reason, payload, headers)
            first_id = first_id or data.get("id")
            usage_total = add_usage(usage_total, data.get("usage"))
            self._count_overhead(turn, chat_usage(data.get("usage")))
            calls, client = self._calls(data["output"], names)
            if calls and not client and with_recall and data.get("status", "completed") == "completed":
                messages = await self._recall_round(turn, messages, data["output"], calls)
                continue
            data["output"] = visible_output(data["output"], names)
            data = as_sent(data, turn.chat.body.get("tools"))
            if first_id:
                data["id"] = first_id
            if usage_total is not None:
                data["usage"] = usage_total
            answer = answer_of(data)
            if answer is not None and isinstance(data.get("id"), str):
                answer["response_id"] = data["id"]
            turn.answer = answer
            turn.usage = chat_usage(usage_total)
            return await self._send(request, turn, status, reason, orjson.dumps(data), headers, record=True)

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        names = turn.view.recall_names
        messages = list(turn.view.messages)
        relay = ResponseStreamFilter(names, turn.chat.body.get("tools"))
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
                    terminal = await self._relay_round(reader, turn, relay, response)
                if terminal is None:
                    raise UpstreamIncomplete("The upstream's stream ended before the response was complete.")
                final = terminal.get("response") if isinstance(terminal.get("response"), dict) else {}
                output = final.get("output") if isinstance(final.get("output"), list) else []
                self._count_overhead(turn, chat_usage(final.get("usage")))
                calls, client = self._calls(output, names)
                recall_round = bool(calls) and not client and with_recall and terminal.get("type") == "response.completed"
                tail = relay.end_round(final, final=not recall_round)
                if recall_round:
                    messages = await self._recall_round(turn, messages, output, calls)
                    relay.new_round()
                    continue
                end = relay.finish(terminal)
                if terminal.get("type") == "response.completed":
                    answer = answer_of({**final, "output": relay.visible})
                    if answer is not None and relay.first and isinstance(relay.first.get("id"), str):
                        answer["response_id"] = relay.first["id"]
                    turn.answer = answer
                turn.usage = chat_usage(relay.usage)
                await self.record(turn)
                await response.write(tail + end)
                await response.write_eof()
                return response
        except GatewayError as exc:
            if response is None or not response.prepared:
                raise
            self.recorder.failed_in_stream(turn, exc)
            await end_stream_with_error(response, exc)
            return response

    async def _relay_round(self, reader, turn: Turn, relay: ResponseStreamFilter, response) -> dict | None:
        """One upstream stream through the filter; returns its terminal event (None: cut short)."""
        decoder, terminal = SSEDecoder(), None
        while True:
            t0 = time.perf_counter()
            chunk = await reader.chunk()
            turn.timing.waiting(t0)
            if not chunk:
                return terminal
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
                    raise UpstreamErrorEvent(event.get("error") if isinstance(event.get("error"), dict) else event)
                if event.get("type") in TERMINAL:
                    terminal = event
                    continue
                out += relay.feed(event)
            if out:
                await response.write(bytes(out))
