"""The recall loop (docs/architecture.md, "Recall"): the gateway answers session_search / session_load itself.

When the view carries recall tools, the upstream's answer is inspected before the client sees
it. Recall calls are executed, appended (call and result, stored as side events) and the
upstream is called again, up to ``recall.max_rounds`` rounds, then once more without recall
tools. The client sees one answer: in streams what the client may see passes through as it
comes, recall calls never do, and the stream keeps the first call's id with usage summed over
every upstream call of the turn. When one answer mixes client and recall calls, the client's win;
an answer cut off (by the output limit, a content filter) is not a recall round: its calls may be
cut too, so the turn ends with them left out. What a recall round says besides its calls reaches
the client, in JSON as in a stream.

One loop serves every format: the turn's format peer (``gateway/pipeline/adapter.py``) writes
the bodies, reads each answer into a ``Reply`` and merges the turn's answers into the client's,
in JSON and in streams; the pipeline that serves the turn (its ``RecallAdapter``) makes each
upstream call (``Pipeline.call``, the plain relay's too), records the answer and ends a failed
stream.

An upstream that refuses tools (an error naming them, on the turn's first call, for a client
that sent none) gets the same view again without recall tools, and that model is not offered
them again by this process (``RecallLoop.tool_less``, one loop for every format); proactive
recall still adds passages.

An upstream failure after the client's stream started (a later round's error status, a reset,
a stall, a stream cut short) ends the stream with the format's error event, and the answer is
not recorded; the provider's own error event is told with its message, type and code.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from gateway.http.errors import GatewayError, UpstreamIncomplete, UpstreamUnreachable
from gateway.http.upstream import response_headers
from gateway.keys import TENANT
from gateway.pipeline.adapter import RecallAdapter, Reply
from gateway.pipeline.relay import relay_stream, streamed
from gateway.pipeline.turn import Turn, TurnRecorder, clean_usage
from gateway.pipeline.views import ViewBuilder
from gateway.recall.auto import add_recalled_history
from policies import last_user_index
from policies.messages import call_name

log = logging.getLogger("palimpsest.recall")


class RecallLoop:
    def __init__(self, *, views: ViewBuilder, tools, recorder: TurnRecorder, max_rounds: int, metrics) -> None:
        self.views = views
        self.tools = tools
        self.recorder = recorder
        self.max_rounds = max_rounds
        self.metrics = metrics
        self.tool_less: set[str] = set()  # models whose upstream refused the recall tools (this process)

    async def recall_ahead(self, turn: Turn) -> bool:
        """Proactive recall (recall.auto_tokens, gateway/recall/auto.py): True when the view got
        a recalled-history block (planned and counted into it, so its figures changed)."""
        return await add_recalled_history(self.tools, self.views, turn)

    async def respond(self, request: web.Request, turn: Turn, adapter: RecallAdapter) -> web.StreamResponse:
        if turn.chat.model in self.tool_less and not (turn.chat.body.get("tools") or turn.chat.body.get("functions")):
            turn.recall_refused = True
        try:
            if turn.chat.stream:
                return await self._stream(request, turn, adapter)
            return await self._json(request, turn, adapter)
        finally:
            self.metrics.recall_rounds.observe(turn.recall_rounds)

    # -- shared ------------------------------------------------------------------------------

    async def _call_json(self, request: web.Request, turn: Turn, adapter: RecallAdapter, messages: list[dict],
                         with_recall: bool):
        """One non-streaming round: (status, reason, payload, headers), or None when the
        upstream refused the recall tools (marked on the turn: the caller asks again)."""
        async with adapter.call(request, turn, turn.peer.recall_body(turn, messages, with_recall, False)) as (up, reader):
            payload = await reader.read(turn.timing)
            headers = response_headers(up.headers, decoded=True)
            status, reason = up.status, up.reason
        if status != 200 and with_recall and self._refused_tools(turn, status, payload):
            turn.recall_refused = True
            return None
        if status == 200:
            self._refusal_confirmed(turn)
        return status, reason, payload, headers

    async def _execute(self, turn: Turn, assistant: dict, recall_calls: list[dict]) -> list[dict]:
        names = turn.view.recall_names
        asking = last_user_index(turn.chat.history)
        results = []
        for call in recall_calls:
            kind = "search" if call_name(call) == names[0] else "load"
            content = await self.tools.run(
                call, kind=kind, session_key=turn.ref.key, path_ids=turn.chat.ids, hidden=turn.view.hidden,
                matches=turn.recall_matches, asking=turn.chat.ids[asking] if asking is not None else None,
                summary=turn.view.summary, entities=turn.view.entities,
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
            if turn.billed is None:
                turn.first_prompt_tokens = billed.prompt
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

    async def _recall_round(self, turn: Turn, messages: list[dict], reply: Reply) -> list[dict]:
        """Run a round's recall calls; the view grown by the call and its results, refitted."""
        results = await self._execute(turn, reply.assistant, reply.recall)
        turn.recall_rounds += 1
        return self._fit(turn, [*messages, reply.assistant, *results])

    def _recalls(self, reply: Reply, with_recall: bool) -> bool:
        return bool(reply.recall) and not reply.client and with_recall and reply.complete

    # -- non-streaming -----------------------------------------------------------------------

    async def _json(self, request: web.Request, turn: Turn, adapter: RecallAdapter) -> web.StreamResponse:
        messages = list(turn.view.messages)
        merged = turn.peer.json_turn(turn)
        while True:
            with_recall = self._with_recall(turn)
            call = await self._call_json(request, turn, adapter, messages, with_recall)
            if call is None:
                continue
            status, reason, payload, headers = call
            if status != 200:
                return await self._send(request, turn, adapter, status, reason, payload, headers)
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                data = None
            reply = merged.read(data) if isinstance(data, dict) else None
            if reply is None:  # relayed as it came, like the plain relay would
                return await self._send(request, turn, adapter, status, reason, payload, headers)
            self._count_overhead(turn, reply.usage)
            if self._recalls(reply, with_recall):
                merged.recalled(reply)
                messages = await self._recall_round(turn, messages, reply)
                continue
            answer, turn.answer, turn.usage = merged.final(data)
            return await self._send(request, turn, adapter, status, reason, orjson.dumps(answer), headers, record=True)

    async def _send(self, request, turn, adapter, status, reason, payload, headers, record=False) -> web.StreamResponse:
        if status != 200:
            self.metrics.upstream_error(status)  # a round's status passed through, as the plain relay counts it
        headers.update(turn.headers)
        headers["x-palimpsest-recall-calls"] = str(turn.recall_calls)
        if turn.billed is not None and turn.usage is not None:
            headers["x-palimpsest-cached-tokens"] = str(turn.billed.cached)
        return await adapter.answer(request, turn, web.Response(status=status, reason=reason, body=payload, headers=headers),
                                    record=record)

    # -- streaming ---------------------------------------------------------------------------

    async def _stream(self, request: web.Request, turn: Turn, adapter: RecallAdapter) -> web.StreamResponse:
        messages = list(turn.view.messages)
        relay = turn.peer.recall_stream(turn)
        response: web.StreamResponse | None = None
        try:
            while True:
                with_recall = self._with_recall(turn)
                async with adapter.call(request, turn, turn.peer.recall_body(turn, messages, with_recall, True)) as (up, reader):
                    if not streamed(up):
                        payload = await reader.read()
                        if response is None and with_recall and self._refused_tools(turn, up.status, payload):
                            turn.recall_refused = True
                            continue
                        if response is None:
                            return await self._send(request, turn, adapter, up.status, up.reason, payload,
                                                    response_headers(up.headers, decoded=True))
                        raise UpstreamUnreachable(f"The upstream answered {up.status} during recall.",
                                                  code=f"upstream_{up.status}")
                    self._refusal_confirmed(turn)
                    if response is None:
                        headers = response_headers(up.headers, decoded=True)
                        headers.update(turn.headers)
                        response = web.StreamResponse(status=200, headers=headers)
                        await response.prepare(request)
                    await relay_stream(reader, response, relay, turn.timing)  # what the filter lets through
                reply = relay.round_end()
                if reply is None:
                    raise UpstreamIncomplete("The upstream's stream ended before the answer was complete.")
                self._count_overhead(turn, reply.usage)
                recall_round = self._recalls(reply, with_recall)
                tail = relay.end_round(final=not recall_round)
                if recall_round:
                    messages = await self._recall_round(turn, messages, reply)
                    relay.new_round()
                    continue
                end = relay.finish()
                turn.answer, turn.usage = relay.answer(), relay.usage()
                await adapter.record(turn, request.get(TENANT))  # durable before the client sees the end
                await response.write(tail + end)
                await adapter.end(request, turn, response)
                return response
        except GatewayError as exc:
            return await adapter.stream_failed(response, turn, exc)
