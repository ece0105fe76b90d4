"""``palimpsest replay``: what each policy profile would have billed on a recorded session.

The client's requests (the configured store's sessions, rebuilt from the ledger and the turn
log's request forms, or ``--from FILE.jsonl``: one request body a line, with its session key and
wire format; ``gateway/cli/replay_sources.py``) are re-sent in their original order, one profile at a time, through a real gateway
(``gateway.app.create_app``, a throw-away store) in front of the built-in simulator
(``simulator.puppet``, strict, with its prompt cache ``simulator/cache.py``), all in this process on
loopback: no key, no network. That is why this module imports the simulator (it is allowed to in
tests/test_architecture.py, like ``palimpsest demo``).

Every upstream call the simulator answers is metered from its own ``usage`` (a middleware added to
the simulator's app before it starts): the session's requests, recall rounds and summary calls.
``billed`` prices them in uncached-input-token units at ``--rates``; ``billed_direct`` is the same
client bodies sent straight to a simulator with no window limit (its cache never expires within
a run, the ideal case); ``direct`` is the profile that passes every request through
(``x-palimpsest-bypass: 1``) to a simulator with no window limit, and counts as ``rejections`` the
requests whose prompt is over the model's real window. Requests are replayed non-streaming, so
every answer carries its usage.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp
import orjson
from aiohttp import web
from pydantic import SecretStr

from gateway.app import create_app
from gateway.keys import LEDGER, TURNS
from gateway.settings import ConfigError, SessionSettings, load_settings
from policies.extraction import values_in
from policies.prices import CacheUsage, read_usage
from simulator.counting import window_for
from gateway.cli.replay_args import PROFILES, RATES, add_arguments
from gateway.cli.replay_chart import write_chart
from gateway.cli.replay_sources import ReplayRequest, load_requests, stored
from simulator.puppet import create_puppet_app

__all__ = ["PROFILES", "RATES", "ReplayRequest", "add_arguments", "billed_units", "load_requests", "replay", "run_replay"]

PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
UNLIMITED = 1 << 30
DEFAULT_WINDOW = 128_000


@dataclass(slots=True)
class Call:
    """One upstream call the simulator answered."""

    summary: bool
    usage: CacheUsage
    body: bytes


def billed_units(usage: CacheUsage, rates: tuple[float, float]) -> float:
    """`usage` in uncached-input-token units. A usage that reports no cache write (Chat,
    Responses) had its uncached tokens written to the simulator's cache: they pay the write rate."""
    read, write = rates
    if usage.cache_write:
        return usage.uncached + usage.cached * read + usage.cache_write * write
    return usage.cached * read + usage.uncached * write


def _meter(calls: list[Call]):
    @web.middleware
    async def middleware(request: web.Request, handler):
        response = await handler(request)
        if isinstance(response, web.Response) and response.body is not None and response.status < 300:
            try:
                usage = orjson.loads(response.body).get("usage")
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                usage = None
            if usage is not None:
                calls.append(Call(request.headers.get("x-palimpsest-purpose", "").lower() == "summary",
                                  read_usage(usage), await request.read()))
        return response
    return middleware


async def _start(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def _puppet(calls: list[Call], windows: dict[str, int]) -> tuple[web.AppRunner, str]:
    app = create_puppet_app(windows=windows, keep_received=0)
    app.middlewares.append(_meter(calls))  # inside the simulator's error middleware: rejections raise past it
    return await _start(app)


def replay_settings(config: str | None, puppet_url: str, store: str, policy: dict[str, Any], windows: dict[str, int]):
    """The replay gateway's settings: what decides a view from `config` (its policy, its
    ``[[policies]]``, its models' prices and APIs, summary and recall tuning) with `policy` on top,
    and everything that names a provider, a key, a tenant or a store the replay's own, so a replay
    never reaches the user's provider, embeddings server or store, whatever `config` says."""
    settings = load_settings(config, upstream={"base_url": puppet_url, "api_key": "", "format": "openai"},
                             store={"path": store, "url": ""}, policy=policy,
                             models={m: {"context_window": w} for m, w in windows.items()},
                             server={"shutdown_timeout_s": 10.0, "client_keys": "off", "admin_token": ""})
    private = ("summary_base_url", "summary_api_key")
    return settings.model_copy(update={
        "upstreams": {}, "tenants": {}, "session": SessionSettings(),
        "policy": settings.policy.model_copy(update=dict.fromkeys(private)),
        "policies": [p.model_copy(update={"policy": {k: v for k, v in p.policy.items() if k not in private}})
                     for p in settings.policies],
        "recall": settings.recall.model_copy(update={"embeddings_url": "", "embeddings_api_key": SecretStr(""),
                                                     "index_uri": "", "index_endpoint": ""}),
    })


def _strings(value: Any, out: list[str]) -> list[str]:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    return out


def _history(body: dict[str, Any]) -> Any:
    return body.get("messages") if "messages" in body else body.get("input")


@dataclass(slots=True)
class Outcome:
    profile: str
    requests: int = 0
    client_prompt_tokens: int = 0
    upstream_prompt_tokens: int = 0
    billed: float = 0.0
    billed_direct: float = 0.0
    rejections: int = 0
    summary_calls: int = 0
    compaction_events: int = 0
    visible: list[float] = field(default_factory=list)
    # Per request, in replay order (the --html chart): upstream prompt tokens, billed units (the
    # summary calls that ran during it included), and the requests that took a new checkpoint or
    # were refused.
    upstream_series: list[int] = field(default_factory=list)
    billed_series: list[float] = field(default_factory=list)
    compacted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    rewrites: list[int] = field(default_factory=list)

    def per_request(self) -> dict[str, Any]:
        return {"upstream_tokens": self.upstream_series, "billed": self.billed_series,
                "new_summaries": self.compacted, "prefix_rewrites": self.rewrites, "rejections": self.rejected}

    def as_json(self) -> dict[str, Any]:
        ratio = round(self.billed / self.billed_direct, 4) if self.billed_direct else None
        shown = round(sum(self.visible) / len(self.visible), 4) if self.visible else None
        return {"profile": self.profile, "requests": self.requests,
                "client_prompt_tokens": self.client_prompt_tokens, "upstream_prompt_tokens": self.upstream_prompt_tokens,
                "billed": round(self.billed, 1), "billed_direct": round(self.billed_direct, 1), "billed_ratio": ratio,
                "rejections": self.rejections, "summary_calls": self.summary_calls,
                "compaction_events": self.compaction_events, "exact_values_visible": shown}


class Bar:
    """tqdm over the requests of every profile, only when `stream` is a terminal."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.bar = None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=stream, unit="req", leave=False)

    def step(self, profile: str) -> None:
        if self.bar is not None:
            self.bar.set_description(profile, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _grouped(requests: list[ReplayRequest]) -> list[list[ReplayRequest]]:
    """Sessions in order of their first request, each session's requests in their order."""
    sessions: dict[tuple[str, str], list[ReplayRequest]] = {}
    for r in requests:
        sessions.setdefault((r.tenant, r.session), []).append(r)
    return list(sessions.values())


def _prepared(request: ReplayRequest, model: str | None) -> dict[str, Any]:
    body = {**request.body, "stream": False}
    body.pop("stream_options", None)
    if model:
        body["model"] = model
    return body


async def _send(http: aiohttp.ClientSession, url: str, request: ReplayRequest, body: dict, bypass: bool) -> aiohttp.ClientResponse:
    key = request.credential()
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key,
               "anthropic-version": "2023-06-01", "X-Session-Id": request.session}
    if bypass:
        headers["x-palimpsest-bypass"] = "1"
    async with http.post(url + PATHS[request.format], data=orjson.dumps(body), headers=headers) as resp:
        await resp.read()
        return resp


def _slices(calls: list[Call], starts: list[int]) -> list[list[Call]]:
    """The calls of each request: from its start to the next one's (the last request's to the
    end: summary jobs drained at the close)."""
    ends = [*starts[1:], len(calls)]
    return [calls[a:b] for a, b in zip(starts, ends)]


async def _baseline(http, sessions, model, rates) -> tuple[list[int], list[float]]:
    """The client's own bodies straight to a simulator with no window limit: per request, its
    prompt tokens and its bill (``client_prompt_tokens``, ``billed_direct``)."""
    calls: list[Call] = []
    starts: list[int] = []
    models = {(model or r.body["model"]) for s in sessions for r in s}
    runner, url = await _puppet(calls, {m: UNLIMITED for m in models})
    try:
        for session in sessions:
            for r in session:
                starts.append(len(calls))
                await _send(http, url, r, _prepared(r, model), False)
    finally:
        await runner.cleanup()
    slices = _slices(calls, starts)
    return ([sum(c.usage.prompt for c in s) for s in slices],
            [sum(billed_units(c.usage, rates) for c in s) for s in slices])


def _windows(sessions, args) -> dict[str, int]:
    """Each model's window: the one the live gateway recorded or configured (``args.windows``),
    else the simulator's rule (``fake-<N>k``), else 128k."""
    models = sorted({(args.model or r.body["model"]) for s in sessions for r in s})
    known = getattr(args, "windows", None) or {}
    return {m: known.get(m) or window_for(m, {}, DEFAULT_WINDOW) for m in models}


async def _profile(http, profile: str, sessions, args, rates, store: str, bar: Bar) -> Outcome:
    calls: list[Call] = []
    starts: list[int] = []
    direct = profile == "direct"
    windows = _windows(sessions, args)
    models = sorted(windows)
    puppet, puppet_url = await _puppet(calls, {m: UNLIMITED for m in models} if direct else windows)
    policy: dict[str, Any] = dict(args.policy_overrides)
    if not direct:
        policy["profile"] = profile
    try:
        settings = replay_settings(args.config, puppet_url, store, policy, windows)
    except ConfigError:
        await puppet.cleanup()
        raise
    app = create_app(settings)
    gateway, url = await _start(app)
    out = Outcome(profile)
    receipts: list[str | None] = []
    try:
        for session in sessions:
            checkpoint = None
            for r in session:
                body = _prepared(r, args.model)
                seen = len(calls)
                starts.append(seen)
                resp = await _send(http, url, r, body, direct)
                mine = [c for c in calls[seen:] if not c.summary]
                if resp.status >= 400 or (direct and any(c.usage.prompt > windows[body["model"]] for c in mine)):
                    out.rejections += 1
                    out.rejected.append(out.requests)
                mark = resp.headers.get("x-palimpsest-checkpoint")
                if mark and mark != checkpoint:
                    out.compaction_events += 1
                    out.compacted.append(out.requests)
                checkpoint = mark or checkpoint
                receipts.append(resp.headers.get("x-palimpsest-receipt"))
                out.requests += 1
                bar.step(profile)
            last = next((c for c in reversed(calls) if not c.summary), None)
            out.visible.append(_visible(session[-1].body, last.body if last else b""))
        out.rewrites = _rewrites(app, receipts)
    finally:
        await gateway.cleanup()  # drains summary jobs: their calls are metered before the totals
        await puppet.cleanup()
    for piece in _slices(calls, starts):
        out.upstream_series.append(sum(c.usage.prompt for c in piece if not c.summary))
        out.billed_series.append(round(sum(billed_units(c.usage, rates) for c in piece), 1))
    out.upstream_prompt_tokens = sum(c.usage.prompt for c in calls if not c.summary)
    out.summary_calls = sum(c.summary for c in calls)
    out.billed = sum(billed_units(c.usage, rates) for c in calls)
    return out


def _rewrites(app: web.Application, receipts: list[str | None]) -> list[int]:
    """The requests (in replay order) at which the view plan rewrote the prompt prefix, from the
    replay gateway's own turn log (the inspector's compaction markers)."""
    rewrote = {row.receipt for record in app[LEDGER].sessions() for row in app[TURNS].session(record.key)
               if row.compaction_event and row.receipt}
    return [i for i, receipt in enumerate(receipts) if receipt in rewrote]


def _visible(client_body: dict[str, Any], upstream_body: bytes) -> float:
    """The share of the exact values in the client's history that the final upstream view shows."""
    found = values_in("\n".join(_strings(_history(client_body), [])))
    wanted = {v for values in found.values() for v in values}
    if not wanted:
        return 1.0
    try:
        text = "\n".join(_strings(orjson.loads(upstream_body), []))
    except orjson.JSONDecodeError:
        text = ""
    return sum(v in text for v in wanted) / len(wanted)


async def replay(requests: list[ReplayRequest], args: argparse.Namespace, err: TextIO = sys.stderr) -> dict[str, Any]:
    """Replay `requests` for each of ``args.profiles``: the ``--json`` object, and under
    ``per_request`` the figures of each request in replay order (what ``--html`` draws)."""
    rates = RATES[args.rates]
    sessions = _grouped(requests)
    bar = Bar(len(requests) * len(args.profiles), err)
    results = []
    per_profile: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as http:
            client_tokens, billed_direct = await _baseline(http, sessions, args.model, rates)
            for profile in args.profiles:
                store = tempfile.mkdtemp(prefix=f"palimpsest-replay-{profile}-")
                try:
                    outcome = await _profile(http, profile, sessions, args, rates, store, bar)
                finally:
                    shutil.rmtree(store, ignore_errors=True)
                outcome.client_prompt_tokens, outcome.billed_direct = sum(client_tokens), sum(billed_direct)
                results.append(outcome.as_json())
                per_profile[profile] = outcome.per_request()
    finally:
        bar.close()
    starts, n = [], 0
    for session in sessions:
        starts.append(n)
        n += len(session)
    return {"sessions": len(sessions), "requests": len(requests),
            "approximate": getattr(args, "approximate", 0), "profiles": results,
            "per_request": {"session_starts": starts, "client_tokens": client_tokens,
                            "billed_direct": [round(b, 1) for b in billed_direct], "profiles": per_profile}}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['sessions']} sessions, {result['requests']} requests replayed against the SIMULATED upstream"]
    if result.get("approximate"):
        lines.append(f"{result['approximate']} of them rebuilt approximately (recorded before request forms were kept: "
                     "no system prompt, tools or parameters)")
    for p in result["profiles"]:
        lines += ["", f"profile {p['profile']}"]
        for key in ("requests", "client_prompt_tokens", "upstream_prompt_tokens", "billed", "billed_direct",
                    "billed_ratio", "rejections", "summary_calls", "compaction_events", "exact_values_visible"):
            value = p[key]
            shown = "n/a" if value is None else f"{value:,.4f}" if isinstance(value, float) and key.endswith(("ratio", "visible")) \
                else f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
            lines.append(f"  {key:<24}{shown:>16}")
    return "\n".join(lines)


def run_replay(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    args.profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in args.profiles if p not in PROFILES]
    if unknown or not args.profiles:
        print(f"palimpsest replay: --profiles has {', '.join(unknown) or 'nothing'}: use {', '.join(PROFILES)}", file=err)
        return 2
    args.policy_overrides = {}
    for item in args.policy:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"palimpsest replay: --policy has value '{item}': use KEY=VALUE", file=err)
            return 2
        args.policy_overrides[key.strip()] = value.strip()
    if args.source and (args.tenant or args.sessions):
        print("palimpsest replay: --tenant and --session choose stored sessions; they do not apply with --from", file=err)
        return 2
    try:
        requests = load_requests(args.source) if args.source else stored(args)
    except (OSError, ValueError, LookupError, ConfigError) as exc:
        print(f"palimpsest replay: {exc}", file=err)
        return 2
    if not requests:
        print(f"palimpsest replay: {args.source or 'the store'} has no requests" +
              (" (for the --tenant/--session given)" if not args.source and (args.tenant or args.sessions) else ""), file=err)
        return 2
    started = time.perf_counter()
    try:
        result = asyncio.run(replay(requests, args, err))
    except ConfigError as exc:
        print(f"palimpsest replay: {exc}", file=err)
        return 2
    if args.html:
        write_chart(args.html, result, args.rates)
    per_request = result.pop("per_request")
    if args.json:
        out.write(orjson.dumps(result).decode() + "\n")
    else:
        print(render(result), file=out)
        print(f"\n{result['requests'] * len(args.profiles)} requests in {time.perf_counter() - started:.1f}s", file=out)
        if args.html:
            print(f"chart of {len(per_request['client_tokens'])} requests written to {args.html}", file=out)
    return 0
