"""The puppet: a SIMULATED OpenAI-compatible provider, scripted by the conversation.

Nothing here talks to a model. The puppet is a real aiohttp application that stands in for the
upstream in tests (on port 0), in benchmarks (``python -m simulator.puppet --port N``) and in the
offline demo. It is as strict as the real provider where that matters to a gateway: it rejects
malformed bodies, unpaired tool calls and prompts over the model's window with the same status
and error envelope, and it streams exactly the SSE chunks the official SDK parses.

Its next move is written in the last message (docs/architecture.md, "The simulator"):

    [[call NAME {json}]]    call the client tool NAME with those arguments
    [[parallel A B]]        call tools A and B in one answer
    RECALL: question        session_search(question) → session_load(top hit) → "ANSWER: ..."
    [[fail STATUS]]         answer with that HTTP status and an OpenAI error envelope
    [[sleep SECONDS]]       wait before answering (timeouts; PuppetState.hangs: one-shot, for the next answers)
    [[stall SECONDS]]       streaming: send the first chunk, then wait (disconnects)
    [[die N]]               streaming: send N events, then reset the connection
    anything else           "ok: <first 40 chars of the last user message>"

The same script answers ``POST /v1/responses`` (simulator.responses) and Anthropic's
``POST /v1/messages`` (simulator.messages), each as strict as its provider.

A tool result as the last message is answered with ``Tool NAME returned: ...``. A request with
the header ``x-palimpsest-purpose: summary`` is answered with a summary that has every
``## Heading`` the request asked for. Every request is logged in ``app[RECEIVED]``; knobs that
tests flip at run time live in ``app[PUPPET_STATE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import time
from typing import Any, Iterable

import orjson
from aiohttp import web

from simulator.counting import content_text, count_message, count_prompt, count_text, window_for
from simulator.errors import SIMULATED_NOTICE, PuppetError, error_middleware, injected_failure, invalid
from simulator.extra_routes import (EMBEDDING_DIM, RECORD_BODY_LIMIT, dumps, echo, echo_gzip,
                                    echo_stream, embeddings, unit_vector, unknown_route)
from simulator.options import add_arguments
from simulator import messages, responses
from simulator.script import RECALL_ANSWER_CHARS, Answer, decide, markers
from simulator.state import (DEFAULT_MODELS, FIXTURE_MODELS, PUPPET_STATE, RECEIVED, PuppetState,
                             record, summary_faults)
from simulator.streaming import ratelimit_headers, stream_completion, stream_faults
from simulator.summary import SUMMARY_WORD_LIMIT, render_summary
from simulator.validation import VALID_ROLES, check_window, parse_json_body, validate_chat

# Everything other code imports from ``simulator.puppet`` stays importable from here.
__all__ = ["DEFAULT_MODELS", "EMBEDDING_DIM", "FIXTURE_MODELS", "FINGERPRINT", "PUPPET_STATE", "RECALL_ANSWER_CHARS", "RECEIVED",
           "RECORD_BODY_LIMIT", "SIMULATED_NOTICE", "SUMMARY_WORD_LIMIT", "VALID_ROLES", "Answer", "add_arguments",
           "PuppetError", "PuppetState", "check_window", "content_text", "count_message",
           "count_prompt", "count_text", "create_puppet_app", "decide", "injected_failure",
           "invalid", "main", "parse_json_body", "render_summary", "start_puppet", "unit_vector",
           "validate_chat", "window_for"]

FINGERPRINT = "fp_puppet_simulated"


# ---------------------------------------------------------------------------------------------
# Chat completions.


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
    state.require_model(body["model"])
    if state.failures:
        raise injected_failure(state.failures.pop(0))
    last_text = content_text(body["messages"][-1].get("content"))
    marks = markers(last_text)
    if "fail" in marks:
        raise injected_failure(int(marks["fail"]))
    if request.headers.get("x-palimpsest-purpose", "").lower() == "summary":
        await summary_faults(state)
    model = body["model"]
    prompt_tokens = count_prompt(body)
    check_window(body, prompt_tokens, state.window(model))
    cached = min(state.prompt_cache.serve(model, body), prompt_tokens)
    delay = state.delay(request, marks)
    if delay:
        await asyncio.sleep(delay)
    summary = request.headers.get("x-palimpsest-purpose", "").lower() == "summary"
    n = body.get("n") or 1
    planned = state.next_answer(request)
    answers = [planned] if planned is not None else [decide(body, summary) for _ in range(n)]
    if summary and state.summary_format == "ignore":  # a model that ignores the required headings
        answers = [Answer(content="\n".join(line.lstrip("#").strip() for line in (a.content or "").splitlines()))
                   for a in answers]
    completion_id = f"chatcmpl-puppet{state.next_id():012d}"
    choices = [_choice(i, a, state) for i, a in enumerate(answers)]
    completion_tokens = sum(_completion_tokens(c["message"]) for c in choices)
    usage: dict[str, Any] | None = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
    }
    if planned is not None and planned.usage:  # a model that reports none, or zeros
        usage = None if planned.usage == "missing" else {k: 0 for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    elif planned is not None and planned.output_tokens is not None:
        usage.update(completion_tokens=planned.output_tokens, total_tokens=prompt_tokens + planned.output_tokens)
    head = {"id": completion_id, "created": int(time.time()), "model": model,
            "system_fingerprint": FINGERPRINT, "service_tier": "default"}
    if body.get("stream"):
        return await stream_completion(request, head, choices, usage, body, *stream_faults(request, marks))
    completion = {**head, "object": "chat.completion", "choices": choices}
    if usage is not None:
        completion["usage"] = usage
    return web.Response(body=orjson.dumps(completion), content_type="application/json",
                        headers=ratelimit_headers())



def _choice(index: int, answer: Answer, state: PuppetState) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": answer.refusal,
                               "annotations": []}
    if answer.reasoning is not None:  # DeepSeek's and vLLM's field for the model's thinking
        message["reasoning_content"] = answer.reasoning
    if answer.calls:
        message["tool_calls"] = [
            {"id": f"call_{state.next_id()}", "type": "function",
             "function": {"name": name, "arguments": arguments}}
            for name, arguments in answer.calls
        ]
    # "plain": "stop" even with calls, as vLLM and Ollama models answer
    finish = {"length": "length", "filter": "content_filter", "plain": "stop"}.get(answer.stop)
    return {"index": index, "message": message, "logprobs": None,
            "finish_reason": finish or ("tool_calls" if answer.calls else "stop")}


def _completion_tokens(message: dict[str, Any]) -> int:
    return count_message(message) - 3 - count_text("assistant")



def model_card(model: str, window: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1_700_000_000,
            "owned_by": "palimpsest-puppet (simulated)", "context_length": window,
            "max_model_len": window}


async def list_models(request: web.Request) -> web.Response:
    state = request.app[PUPPET_STATE]
    await record(request, b"", None)
    data = [model_card(m, state.window(m)) for m in state.known_models()]
    return web.json_response({"object": "list", "data": data}, dumps=dumps)


async def get_model(request: web.Request) -> web.Response:
    state = request.app[PUPPET_STATE]
    await record(request, b"", None)
    model = request.match_info["model"]
    state.require_model(model)
    return web.json_response(model_card(model, state.window(model)), dumps=dumps)



# ---------------------------------------------------------------------------------------------
# The application.


def create_puppet_app(*, default_window: int = 128_000, windows: dict[str, int] | None = None,
                      chunk_chars: int = 12, latency_s: float = 0.0,
                      keep_received: int | None = None,
                      models: Iterable[str] | None = None) -> web.Application:
    """A SIMULATED OpenAI-compatible provider (see the module docstring).

    It serves the models named in `windows` and `models` (default: DEFAULT_MODELS plus the
    FIXTURE_MODELS tests and benchmarks use) and any ``fake-<N>k``; other names get 404.
    """
    app = web.Application(middlewares=[error_middleware], client_max_size=1 << 30)
    app[RECEIVED] = []
    app[PUPPET_STATE] = PuppetState(default_window=default_window, windows=dict(windows or {}),
                                    chunk_chars=chunk_chars, latency_s=latency_s,
                                    keep_received=keep_received,
                                    models=tuple(DEFAULT_MODELS + FIXTURE_MODELS if models is None
                                                 else models))
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_post("/v1/embeddings", embeddings)
    responses.add_routes(app)
    messages.add_routes(app)
    app.router.add_route("*", "/v1/echo/gzip", echo_gzip)
    app.router.add_route("*", "/v1/echo/stream", echo_stream)
    app.router.add_route("*", "/v1/echo", echo)
    app.router.add_route("*", "/v1/echo/{tail:.*}", echo)
    app.router.add_route("*", "/v1/{tail:.*}", unknown_route)
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


def app_from_args(args: argparse.Namespace) -> web.Application:
    windows: dict[str, int] = {}
    extra: list[str] = []
    for item in [*args.window, *args.model]:
        model, _, tokens = item.partition("=")
        extra.append(model)
        if tokens:
            windows[model] = int(tokens)
    return create_puppet_app(default_window=args.default_window, windows=windows,
                             chunk_chars=args.chunk_chars, latency_s=args.latency,
                             keep_received=args.keep_received,
                             models=(*DEFAULT_MODELS, *(FIXTURE_MODELS if args.fixtures else ()), *extra))


def serve(args: argparse.Namespace, banner: str | None = None, sock: socket.socket | None = None) -> None:
    """Serve until interrupted, on `sock` when given (bound by the caller, who reported a busy
    port already), else on args.host:args.port."""
    app = app_from_args(args)
    with contextlib.suppress(ImportError):
        import uvloop  # optional: the benchmark's upstream should not be its bottleneck

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    print(banner or f"puppet ({SIMULATED_NOTICE}) on http://{args.host}:{args.port}/v1", flush=True)
    if sock is not None:
        web.run_app(app, sock=sock, access_log=None, print=None)
    else:
        web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simulator.puppet", description=__doc__.split(
        "\n\n")[0] + " Serves until interrupted.")
    add_arguments(parser)
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
