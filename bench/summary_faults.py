"""Summary jobs under faults: what a weak or rate-limited summary model costs.

    .venv/bin/python bench/summary_faults.py --quick      # < 1 minute
    .venv/bin/python bench/summary_faults.py              # ~3 minutes on 2 CPUs
    .venv/bin/python bench/summary_faults.py --seeds 1,2,3 --rounds 60 --profiles balanced --json out.json

Everything talks to the SIMULATED upstream (simulator.puppet), in one process (bench/common.py).
A synthetic agent session (simulator.workloads, 2 requests per round, tool outputs of 300-2,500
tokens) is replayed through the gateway on ``fake-32k`` with three summary models:

- ``good``: answers in the required format;
- ``ignore``: ignores the required headings (every summary is rejected);
- ``429``: every summary call answers 429 with ``Retry-After: 20``.

Time is scaled so the run is short but the clocks keep their proportions: every model answer
takes ``--answer-s`` (2 s) and every summary call ``--summary-s`` (5 s), and the gateway's
backoff, breaker cool-down and the Retry-After are all multiplied by ``--time-scale`` (0.02) like
the answers are. Figures per row: summary calls per client request and upstream/client prompt
tokens (the puppet's own count, cl100k, of what it received and of what the client sent), with
the issue's targets for the format-ignoring model: <= 0.2 calls per request, <= 0.35 tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODEL, WINDOW, Bench, Client, count_prompt, fmt, machine_note, quiet_logs, replay, run_and_report  # noqa: E402
from gateway.keys import CHECKPOINTS  # noqa: E402
from policies.summary import DETERMINISTIC_MODEL  # noqa: E402
from simulator.puppet import PUPPET_STATE  # noqa: E402
from simulator.workloads import synthetic_session  # noqa: E402

PURPOSE = "x-palimpsest-purpose"
SCENARIOS = ("good", "ignore", "429")
TARGET_CALLS, TARGET_TOKENS = 0.2, 0.35
# The gateway's own defaults, in seconds of real time (gateway/settings.py [summary]).
BACKOFF_BASE_S, BACKOFF_MAX_S, BREAKER_COOLDOWN_S, RETRY_AFTER_S = 30.0, 900.0, 60.0, 20.0


async def one(args, profile: str, scenario: str, seed: int) -> dict:
    scale = args.time_scale
    summary = {"backoff_base_s": BACKOFF_BASE_S * scale, "backoff_max_s": BACKOFF_MAX_S * scale,
               "breaker_cooldown_s": BREAKER_COOLDOWN_S * scale}
    bench = await Bench.start(summary_delay_s=args.summary_s * scale, summary=summary, policy={"profile": profile})
    bench.puppet.answer_delay_s = args.answer_s * scale
    state = bench.puppet.app[PUPPET_STATE]
    if scenario == "ignore":
        state.summary_format = "ignore"
    elif scenario == "429":
        state.summary_status = 429
        state.retry_after = f"{RETRY_AFTER_S * scale:g}"
    client = Client(bench.gateway.base_url)
    sid = f"bench-faults-{scenario}-{seed}"
    try:
        started = time.perf_counter()
        _, sent = await replay(client, synthetic_session(seed, rounds=args.rounds), sid)
        wall = time.perf_counter() - started
        await bench.gateway.settle()
        chats = [r for r in bench.puppet.chat_requests() if r.get("json")]
        forwarded = [r for r in chats if r["headers"].get(PURPOSE, "") != "summary"]
        calls = len(chats) - len(forwarded)
        upstream_tokens = sum(count_prompt(r["json"]) for r in forwarded)
        client_tokens = sum(s.client_tokens for s in sent)
        key = bench.gateway.session_key(sid)
        cps = bench.gateway.app[CHECKPOINTS].list(key) if key else []
        return {
            "profile": profile, "scenario": scenario, "seed": seed, "rounds": args.rounds,
            "requests": len(sent), "errors": sum(s.reply.status != 200 for s in sent),
            "summary_calls": calls, "calls_per_request": calls / max(1, len(sent)),
            "client_tokens": client_tokens, "upstream_tokens": upstream_tokens,
            "tokens_ratio": upstream_tokens / max(1, client_tokens),
            "over_window": sum(count_prompt(r["json"]) + (r["json"].get("max_tokens") or 0) > WINDOW for r in chats
                               if r["json"].get("model") == MODEL),
            "checkpoints": len(cps), "deterministic": sum(cp.model == DETERMINISTIC_MODEL for cp in cps),
            "skipped": bench.gateway.metric("palimpsest_summary_jobs_skipped_total"),
            "breaker_opened": bench.gateway.metric("palimpsest_summary_breaker_transitions_total", {"kind": "open"}),
            "wall_s": wall,
        }
    finally:
        await client.close()
        await bench.stop()


async def run(args) -> dict:
    quiet_logs()
    rows = []
    for profile in args.profile_list:
        for scenario in args.scenario_list:
            for seed in args.seed_list:
                rows.append(await one(args, profile, scenario, seed))
    return {"rows": rows, "machine": machine_note()}


def render(result: dict) -> str:
    head = ("profile", "model", "seed", "req", "err", ">win", "sum calls", "calls/req", "up/cl", "cps", "determ.", "skipped", "opened")
    lines = ["  ".join(f"{h:>9}" for h in head)]
    for r in result["rows"]:
        cells = (r["profile"], r["scenario"], r["seed"], r["requests"], r["errors"], r["over_window"], r["summary_calls"],
                 fmt(r["calls_per_request"], 3), fmt(r["tokens_ratio"], 3), r["checkpoints"], r["deterministic"],
                 fmt(int(r["skipped"])), fmt(int(r["breaker_opened"])))
        lines.append("  ".join(f"{c if isinstance(c, str) else fmt(c):>9}" for c in cells))
    lines.append("")
    for profile in dict.fromkeys(r["profile"] for r in result["rows"]):
        weak = [r for r in result["rows"] if r["profile"] == profile and r["scenario"] == "ignore"]
        if weak:
            calls = max(r["calls_per_request"] for r in weak)
            tokens = max(r["tokens_ratio"] for r in weak)
            errors = sum(r["errors"] for r in result["rows"] if r["profile"] == profile)
            lines.append(
                f"targets, format-ignoring model, profile {profile} (worst seed): summary calls/request {calls:.3f} "
                f"(<= {TARGET_CALLS}: {'ok' if calls <= TARGET_CALLS else 'MISSED'}), upstream/client tokens {tokens:.3f} "
                f"(<= {TARGET_TOKENS}: {'ok' if tokens <= TARGET_TOKENS else 'MISSED'}), client errors {errors}")
    lines.append(result["machine"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 42 rounds, the default profile")
    parser.add_argument("--seeds", default=None, help="synthetic session seeds (default 31,32)")
    parser.add_argument("--rounds", type=int, default=42, help="rounds per session (2 requests each)")
    parser.add_argument("--profiles", default=None, help="policy profiles (default balanced,economy)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {','.join(SCENARIOS)}")
    parser.add_argument("--answer-s", type=float, default=2.0, help="seconds per model answer, before scaling")
    parser.add_argument("--summary-s", type=float, default=5.0, help="seconds per summary call, before scaling")
    parser.add_argument("--time-scale", type=float, default=0.02, help="multiplies every duration above and the gateway's waits")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    args.seed_list = [int(s) for s in (args.seeds or ("31" if args.quick else "31,32")).split(",") if s]
    args.profile_list = [p for p in (args.profiles or ("balanced" if args.quick else "balanced,economy")).split(",") if p]
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    run_and_report(run, render, args)


if __name__ == "__main__":
    main()
