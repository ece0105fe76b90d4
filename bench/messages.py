"""Anthropic Messages through the gateway (issue 21): a Claude-Code-like thinking tool loop, side by side with sending direct.

    /work/venv/bin/python bench/messages.py              # ~1 minute on 2 CPUs
    /work/venv/bin/python bench/messages.py --steps 60 --recall 20

Everything runs in one process on loopback ports: the SIMULATED upstream (``simulator.puppet``,
its strict /v1/messages with Anthropic's prompt-cache accounting) and a real gateway app. The
client is the official anthropic SDK, playing an agent: one task, then a ``Bash`` call per step
whose result (1-4k tokens, a planted fact on its first line) scripts the next call; the client
marks its system and its newest tool result with ``cache_control`` as Claude Code does.

1. ``fake-32k``: the loop direct (a rejection ends the chain: the task is lost) and through the
   gateway; then ``--recall`` questions about planted facts, through the gateway.
2. ``fake-200k`` (where direct fits): the same loop both ways, for the cache-read share.

Summary calls (both models' runs) are counted apart: their prompt tokens, billed as fresh input,
and the 32k cost with them. Figures: requests answered and rejected, upstream / client prompt tokens (the simulator's own
count of what it received, against the client's bodies counted the same way), billed prompt cost
(input 1×, cache reads 0.1×, cache writes 1.25×) against the client's history sent with ideal
caching (each request reads the previous request's prompt and writes the rest), the cache-read
share of upstream prompt tokens, facts recalled, and the client-side time added per request (p50
of gateway minus direct, step by step).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import anthropic  # noqa: E402
from aiohttp import web  # noqa: E402

from bill_parts import Call, breakdown, header, is_recall_round, render  # noqa: E402
import prefix_breaks  # noqa: E402
from common import quiet_logs  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.keys import METRICS  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from simulator.messages_rules import blocks  # noqa: E402
from simulator.puppet import PUPPET_STATE, RECEIVED, create_puppet_app  # noqa: E402

BASH = {"name": "Bash", "description": "Executes a bash command and returns its output.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
SYSTEM = [{"type": "text", "text": "You are a coding agent. " * 200, "cache_control": {"type": "ephemeral"}}]
HEADERS = {"anthropic-beta": "interleaved-thinking-2025-05-14"}
WRITE_RATE = 1.25  # a cache write: 1.25x with the 5-minute TTL, 2x with the 1-hour one (--write-rate)
# --client-ttl: the client's markers ask this TTL (as Claude Code's do: the same ttl on its system
# and its newest message), and every bill is priced from usage's split: 5-minute writes 1.25x,
# 1-hour writes 2x ("": the markers carry no ttl and --write-rate prices every write).
CLIENT_TTL = ""
WRITE_5M, WRITE_1H = 1.25, 2.0
# --pause-every N: before every Nth step the user is away --pause-s seconds (the simulator's cache
# clock jumps; entries whose TTL that outlives are gone). 0: no pauses.
PAUSE_EVERY, PAUSE_S, AWAY = 0, 600.0, [0.0]


SEED = 0  # --seed: another sequence of output sizes (0: the sizes every earlier figure used)


def output(step: int) -> str:
    words = 1000 + ((step + 13 * SEED) * 977) % 3000  # 1-4k tokens
    filler = " ".join(f"log{step}.{i} ok" for i in range(words // 3))
    return (f"fact {step}: the build artifact of step {step} is /srv/out/step{step}-{step * 7919 % 1000}.bin\n"
            f"{filler}\n[[call Bash {{\"command\": \"step {step + 1}\"}}]]")


def system() -> list[dict]:
    return [{**SYSTEM[0], "cache_control": marker()}]


def marker() -> dict:
    return {"type": "ephemeral", "ttl": CLIENT_TTL} if CLIENT_TTL else {"type": "ephemeral"}


def write_rates() -> tuple[float, float | None]:
    """(a write's rate, a 1-hour write's rate): from usage's split with --client-ttl."""
    return (WRITE_5M, WRITE_1H) if CLIENT_TTL else (WRITE_RATE, None)


def meter(calls: list[tuple[str, Call]], phase: list[str]):
    """Every answered /v1/messages call as a bench/bill_parts.py Call, tagged with the bench's
    phase (the run it belongs to)."""
    @web.middleware
    async def middleware(request: web.Request, handler):
        response = await handler(request)
        if request.path.endswith("/messages") and getattr(response, "body", None) and response.status == 200:
            import orjson
            usage = orjson.loads(response.body).get("usage") or {}
            body = orjson.loads(await request.read())
            kind = ("summary" if request.headers.get("x-palimpsest-purpose") == "summary" else
                    "recall" if is_recall_round(body) else "main")
            read, written = usage.get("cache_read_input_tokens") or 0, usage.get("cache_creation_input_tokens") or 0
            hour = (usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0
            calls.append((phase[0] if kind != "summary" else "summary-" + body.get("model", ""),
                          Call(kind, usage.get("input_tokens", 0) + read + written, read, written, hour)))
        return response
    return middleware


def policy_keys(items: list[str]) -> dict:
    """--policy KEY=VALUE items as [policy] keys (VALUE parsed as JSON, else a string)."""
    import orjson
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class Run:
    def __init__(self) -> None:
        self.answered = self.rejected = 0
        self.client_tokens = self.upstream_tokens = self.read = self.written = self.fresh = self.written_1h = 0
        self.ideal = 0.0
        self.latency: list[float] = []
        self.history: list[dict] = []
        self.growth: list[int] = []  # client tokens added per request (bench/bill_parts.py)

    def billed(self) -> float:
        write, hour = write_rates()
        return self.fresh + 0.1 * self.read + write * (self.written - self.written_1h) + (hour or write) * self.written_1h


async def loop(client: anthropic.AsyncAnthropic, model: str, steps: int, session: str) -> Run:
    run = Run()
    history = [{"role": "user", "content": "Run the chain. [[call Bash {\"command\": \"step 1\"}]]"}]
    previous = 0
    for step in range(1, steps + 1):
        if PAUSE_EVERY and step % PAUSE_EVERY == 0:
            AWAY[0] += PAUSE_S
        body = {"model": model, "max_tokens": 2048, "system": system(), "tools": [BASH], "messages": history,
                "thinking": {"type": "enabled", "budget_tokens": 1024}}
        tokens = sum(t for _, t, _ in blocks(body))
        t0 = time.perf_counter()
        try:
            message = await client.messages.create(**body, extra_headers={**HEADERS, "X-Claude-Code-Session-Id": session})
        except anthropic.BadRequestError:
            run.rejected += 1
            break  # the provider refused the prompt: the chain is lost
        run.latency.append(time.perf_counter() - t0)
        run.answered += 1
        run.client_tokens += tokens
        # Ideal direct: reads the previous prompt, writes the rest at the client's markers' TTL.
        run.ideal += 0.1 * previous + (WRITE_1H if CLIENT_TTL == "1h" else write_rates()[0]) * (tokens - previous)
        run.growth.append(tokens - previous)
        previous = tokens
        usage = message.usage
        run.fresh += usage.input_tokens
        run.read += usage.cache_read_input_tokens or 0
        run.written += usage.cache_creation_input_tokens or 0
        run.written_1h += (usage.cache_creation.ephemeral_1h_input_tokens or 0) if usage.cache_creation else 0
        run.upstream_tokens += usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
        call = next(b for b in message.content if b.type == "tool_use")
        for earlier in history:
            for blk in earlier["content"] if isinstance(earlier["content"], list) else ():
                blk.pop("cache_control", None)
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                     "content": output(step), "cache_control": marker()}]})
    run.history = history
    return run


async def recall(client, model: str, run: Run, questions: int, session: str) -> tuple[int, int]:
    history = list(run.history)
    history[-1] = {"role": "user", "content": [{**history[-1]["content"][0], "content": "done"}]}
    history.append({"role": "assistant", "content": [{"type": "text", "text": "Chain finished."}]})
    found = 0
    asked = range(1, max(2, min(questions, run.answered // 2)) + 1)
    for step in asked:
        ask = [*history, {"role": "user", "content": f"RECALL: fact {step}: the build artifact of step {step}"}]
        message = await client.messages.create(model=model, max_tokens=2048, system=system(), tools=[BASH], messages=ask,
                                               extra_headers={**HEADERS, "X-Claude-Code-Session-Id": session})
        text = "".join(b.text for b in message.content if b.type == "text")
        found += f"/srv/out/step{step}-{step * 7919 % 1000}.bin" in text
    return found, len(asked)


def record_overheads(app) -> list[float]:
    """The gateway's own time per /v1/messages request (wall time minus upstream waits), as
    its TurnRecorder observes it."""
    from gateway.keys import MESSAGES

    recorder = app[MESSAGES].recorder
    seen: list[float] = []
    observe = recorder.observe

    def timed(turn) -> None:
        seen.append(time.perf_counter() - turn.timing.started - turn.timing.upstream)
        observe(turn)

    recorder.observe = timed
    return seen


def row(name: str, run: Run | None, extra: str = "") -> str:
    if run is None:
        return f"{name:<22} -"
    ratio = run.upstream_tokens / run.client_tokens if run.client_tokens else float("nan")
    cost = run.billed() / run.ideal if run.ideal else float("nan")
    share = run.read / run.upstream_tokens if run.upstream_tokens else float("nan")
    return (f"{name:<22} {run.answered:>5} {run.rejected:>4} {run.client_tokens:>10,} {run.upstream_tokens:>10,} "
            f"{ratio:>6.2f} {cost:>6.2f} {share:>6.2f} {run.read:>10,} {run.written:>9,} {extra}")


async def main(args) -> None:
    global WRITE_RATE, SEED, CLIENT_TTL, PAUSE_EVERY, PAUSE_S
    WRITE_RATE, SEED, CLIENT_TTL, PAUSE_EVERY, PAUSE_S = args.write_rate, args.seed, args.client_ttl, args.pause_every, args.pause_s
    quiet_logs()
    puppet = create_puppet_app(windows={"fake-32k": 32_000, "fake-200k": 200_000})
    puppet[PUPPET_STATE].clock = lambda: time.monotonic() + AWAY[0]
    metered: list[tuple[str, Call]] = []
    phase = ["direct"]
    puppet.middlewares.append(meter(metered, phase))
    prunner, purl = await serve(puppet)
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, upstream={"base_url": purl + "/v1", "format": "anthropic"},
                                 store={"path": tmp}, policy={"profile": args.profile, "cache_write_rate": write_rates()[0],
                                                                       "cache_write_1h_rate": write_rates()[1] or WRITE_RATE,
                                                                       **policy_keys(args.policy)})
        gapp = create_app(settings)
        grunner, gurl = await serve(gapp)
        direct = anthropic.AsyncAnthropic(base_url=purl, api_key="sk-bench", max_retries=0, timeout=120)
        gateway = anthropic.AsyncAnthropic(base_url=gurl, api_key="sk-bench", max_retries=0, timeout=120)
        d32 = await loop(direct, "fake-32k", args.steps, "direct-32k")
        phase[0] = "gw-32k"
        start = len(puppet[RECEIVED])
        g32 = await loop(gateway, "fake-32k", args.steps, "gw-32k")
        phase[0] = "after"
        await asyncio.sleep(1.0)  # let the summary job of the last steps land
        found, asked = await recall(gateway, "fake-32k", g32, args.recall, "gw-32k")
        views = [r["json"] for r in puppet[RECEIVED][start:]
                 if r.get("json") and not r["headers"].get("x-palimpsest-purpose") and r["path"].endswith("/messages")]
        breaks = prefix_breaks.decompose([[(k, t) for k, t, _ in blocks(v)] for v in views],
                                         [is_recall_round(v) for v in views])
        d200 = await loop(direct, "fake-200k", args.steps, "direct-200k")
        own = record_overheads(gapp)
        g200 = await loop(gateway, "fake-200k", args.steps, "gw-200k")
        summary_bodies = [r["json"] for r in puppet[RECEIVED]
                          if r["headers"].get("x-palimpsest-purpose") == "summary" and r.get("json")]
        summaries = len(summary_bodies)
        # Summary calls as the provider billed them (the gateway's own count of their usage).
        registry = gapp[METRICS].registry

        def summary_tokens(kind: str) -> float:
            return sum(registry.get_sample_value("palimpsest_upstream_billed_tokens_total",
                                                 {"model": m, "caller": "summary", "kind": kind}) or 0
                       for m in ("fake-32k", "fake-200k"))

        summary_prompt = summary_tokens("uncached") + summary_tokens("cached") + summary_tokens("cache_write") + summary_tokens("cache_write_1h")
        write, hour = write_rates()
        summary_cost = (summary_tokens("uncached") + 0.1 * summary_tokens("cached") + write * summary_tokens("cache_write")
                        + (hour or write) * summary_tokens("cache_write_1h"))
        await grunner.cleanup()
    await prunner.cleanup()
    added = [g - d for g, d in zip(g200.latency, d200.latency)]
    print(f"Messages agent loop, {args.steps} Bash steps (outputs 1-4k tokens), thinking on; simulated upstream.")
    print(f"{'run':<22} {'ok':>5} {'rej':>4} {'client tok':>10} {'upstr tok':>10} {'up/cl':>6} {'cost':>6} {'read%':>6} "
          f"{'cache read':>10} {'cache wr':>9}")
    print(row("direct fake-32k", d32, "(chain lost)" if d32.rejected else ""))
    print(row("palimpsest fake-32k", g32, f"+ {summaries} summary calls, {summary_prompt:,.0f} prompt tokens "
                                          f"(cached {summary_tokens('cached') / max(1.0, summary_prompt):.2f}): cost "
                                          f"{(g32.billed() + summary_cost) / max(1.0, g32.ideal):.2f} with them"))
    print(row("direct fake-200k", d200))
    print(row("palimpsest fake-200k", g200))
    share = lambda r: r.read / r.upstream_tokens if r.upstream_tokens else 0.0  # noqa: E731
    print(f"planted facts recalled through the gateway: {found}/{asked}")
    parts = breakdown([c for p, c in metered if p in ("gw-32k", "summary-fake-32k")], g32.growth, g32.ideal,
                      read=0.1, write=write_rates()[0], write_1h=write_rates()[1])
    print("Where the 32k loop's bill goes (bench/bill_parts.py; summaries included):")
    print(header())
    print(render(f"gateway fake-32k, {args.profile}", parts))
    print("Where the 32k loop's prefix breaks (bench/prefix_breaks.py; pairs, mean share of the newer prompt lost per class):")
    print(prefix_breaks.render("gateway", breaks, g32.ideal))
    if args.calls:
        for n, (p, c) in enumerate(metered):
            if p in ("gw-32k", "summary-fake-32k"):
                print(n, p, c)
    print(f"client-side time added per request on fake-200k, p50 of gateway minus direct: "
          f"{statistics.median(added) * 1000:.1f} ms (includes the SDK and loopback; puppet time is the same); "
          f"the gateway's own time (wall minus upstream waits): p50 {statistics.median(own) * 1000:.1f} ms, "
          f"max {max(own) * 1000:.1f} ms")
    print("targets: 32k completes with 0 rejections: "
          f"{'yes' if g32.answered == args.steps and not g32.rejected else 'NO'}; up/cl <= 0.30: "
          f"{g32.upstream_tokens / max(1, g32.client_tokens):.2f}; cost <= 0.6: {g32.billed() / max(1.0, g32.ideal):.2f}; "
          f"200k read share >= direct's - 0.05: {share(g200):.2f} vs {share(d200):.2f}; recalled >= 0.95: {found / max(1, asked):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--recall", type=int, default=10)
    parser.add_argument("--profile", default="balanced", help="the gateway policy profile (economy, balanced, fidelity)")
    parser.add_argument("--calls", action="store_true", help="print every metered call of the 32k gateway run")
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                        help="a [policy] key for the gateway (repeatable; VALUE parsed as JSON, else a string)")
    parser.add_argument("--seed", type=int, default=0, help="another sequence of tool-output sizes (0: the default one)")
    parser.add_argument("--write-rate", type=float, default=1.25, help="price of a cache write (2.0: Anthropic's 1-hour TTL)")
    parser.add_argument("--client-ttl", default="", choices=("", "5m", "1h"),
                        help="the client's markers ask this TTL, as Claude Code's do; bills priced from usage's 5m/1h split")
    parser.add_argument("--pause-every", type=int, default=0, help="the user is away before every Nth step (0: never)")
    parser.add_argument("--pause-s", type=float, default=600.0, help="how long each pause lasts, on the simulator's cache clock")
    asyncio.run(main(parser.parse_args()))
