"""Qwen Code (Chat Completions) over the 34-step shell chain: direct vs through the gateway, 32k.

    PALIMPSEST_CLIENTS=.clients python -m bench.qwen_chain [--calls 34] [--runs 1]

The real ``qwen`` binary (tests/support/clis.py; .ci/run installs it into .clients/) runs the
chain of tests/support/chain.py (1-3k tokens per output) against the simulated provider:
- **direct, 32k**: straight to fake-32k, as the client would without the gateway;
- **gateway, 32k**: through the gateway (balanced profile), X-Session-Id from its settings;
- **ideal direct**: straight to a 2M-token model with Qwen Code's own compression off: the
  client's append-only history with no window limit, the baseline of the token and cost ratios.
Figures as in bench/responses.py: completion, upstream requests, requests the simulator refused
for the window (prompt + max_tokens over it), upstream / ideal prompt tokens, billed / ideal (OpenAI's prefix
cache rule, every upstream call included: summaries too), prefix stability, wall seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from bench import prefix_breaks
from bench.common import machine_note, quiet_logs
from bench.responses import BIG, SMALL, WINDOWS, Run, billed, stability
from simulator.counting import count_prompt
from simulator.puppet import RECEIVED
from tests.support.chain import first_prompt
from tests.support.clis import run_qwen


def rerendered(views: list[dict]) -> int:
    """Consecutive views whose summary block changed while its summary did not: the block
    re-rendered (its exact values) with no new checkpoint, a prompt rewrite from the block on."""
    def block(body: dict) -> str | None:
        return next((str(m["content"]) for m in body["messages"] if str(m.get("content")).startswith("<session_summary>")), None)
    count = 0
    for a, b in zip(views, views[1:]):
        x, y = block(a), block(b)
        if x and y and x != y and x.split("Exact values")[0] == y.split("Exact values")[0]:
            count += 1
    return count


async def leg(calls: int, *, gateway: bool, model: str, compress: bool = True) -> dict:
    run = await Run.start(gateway=gateway)
    try:
        started = time.monotonic()
        result = await run_qwen(run.base_url, first_prompt("qwen", calls), model=model, timeout_s=600,
                                session="bench-qwen" if gateway else None, compress=compress)
        wall = time.monotonic() - started
        sent = [r["json"] for r in run.puppet.app[RECEIVED] if r["path"].endswith("/chat/completions") and r.get("json")]
        # What the strict simulator refuses: prompt + max_tokens over the model's window.
        refused = sum(1 for b in sent if count_prompt(b) + (b.get("max_tokens") or 0) > WINDOWS[model])
        done = any(f"CHAIN COMPLETE after {calls} steps" in str(m.get("content")) for m in sent[-1]["messages"][-3:])
        views = [b for b, r in zip(sent, [r for r in run.puppet.app[RECEIVED] if r["path"].endswith("/chat/completions")
                                          and r.get("json")]) if not r["headers"].get("x-palimpsest-purpose")]
        return {"completed": done and result.returncode == 0, "requests": len(run.upstream(views_only=True)),
                "upstream": run.upstream(), "views": run.upstream(views_only=True), "refused": refused,
                "wall": wall, "rerendered": rerendered(views)}
    finally:
        await run.close()


async def main(args) -> None:
    quiet_logs()
    print(machine_note())
    for n in range(args.runs):
        direct = await leg(args.calls, gateway=False, model=SMALL)
        through = await leg(args.calls, gateway=True, model=SMALL)
        ideal = await leg(args.calls, gateway=False, model=BIG, compress=False)
        ideal_tokens, ideal_cost = billed(ideal["upstream"])
        print(f"\nrun {n + 1}: {args.calls} steps")
        print("| figure | direct, 32k | gateway, 32k | ideal direct (2M, no client compression) |")
        print("|---|---|---|---|")
        print("| chain completed | " + " | ".join(str(x["completed"]) for x in (direct, through, ideal)) + " |")
        print("| upstream requests (views) | " + " | ".join(str(x["requests"]) for x in (direct, through, ideal)) + " |")
        print("| refused for the window (prompt + max_tokens) | " + " | ".join(str(x["refused"]) for x in (direct, through, ideal)) + " |")
        ratios = []
        for x in (direct, through, ideal):
            tokens, cost = billed(x["upstream"])
            ratios.append(f"{tokens / ideal_tokens:.3f} / {cost / ideal_cost:.3f}")
        print("| upstream tokens / ideal, billed / ideal | " + " | ".join(ratios) + " |")
        print("| prefix stability | " + " | ".join(stability(x["views"]) for x in (direct, through, ideal)) + " |")
        print(f"| summary block re-rendered, same summary | - | {through['rerendered']} | - |")
        print("| wall s | " + " | ".join(f"{x['wall']:.1f}" for x in (direct, through, ideal)) + " |")
        print(prefix_breaks.render("gateway", prefix_breaks.decompose(through["views"]), ideal_cost))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=34)
    parser.add_argument("--runs", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
