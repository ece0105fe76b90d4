"""Standing instructions and checked summaries (issue 28, items 1, 2 and 4), side by side with
sending direct.

    .venv/bin/python bench/standing.py                      # 3 seeds x 3 formats, ~3 minutes on 2 CPUs
    .venv/bin/python bench/standing.py --seeds 0 --formats chat --rounds 40
    .venv/bin/python bench/standing.py --fp-only            # false positives on the real data only

Everything runs in one process on loopback ports: the SIMULATED upstream (``simulator.puppet``)
on ``fake-32k`` and a real gateway app. Each session is ``simulator.standing.standing_session``:
60 tool-heavy rounds whose user states three rules in rounds 2, 4 and 6 ("From now on, never run
database migrations against the ... cluster without my written approval."), played in Chat
Completions, the Responses API and Anthropic Messages (raw HTTP, as the SDKs send them).

Figures, per format and mode:

- **verbatim**: over the last 15 requests the upstream answered for the client (summary calls
  apart), the share of the rules whose sentence is in the request word for word; **worst**: the
  lowest share of one request. Direct, a request the upstream rejected (over the window) carries
  nothing to the model and counts 0.
- **checks**: ``palimpsest_summary_checks_total`` by outcome (passed, repaired, refused) and
  ``palimpsest_summary_check_problems_total`` by problem, after the sessions.

Modes: ``direct`` (the client's full history to the upstream), ``unpinned`` (the gateway with
``pinned_ratio = 0``: no pinned block; the checked summary must then quote every rule) and
``pinned`` (the default, 5% of the budget).

False positives: the detector (``policies/pinned.py``) over every user turn of the tau-bench
trajectories and the LongMemEval haystacks, split into a tuning part and a held-out part (every
third trajectory / case file, by sorted position, is held out); every rule it finds is counted as
pinned by mistake (neither data set was written to set session rules, so this is an upper bound),
per 100 user turns, and the held-out ones are listed for reading.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from common import API_KEY, MODEL, Bench, quiet_logs  # noqa: E402
from simulator.standing import ROUTES, play, standing_session  # noqa: E402

TAU = "/work/shared/data/tau-bench/gpt-4o-airline.json"
LONGMEMEVAL = "/work/shared/data/longmemeval"
LATE = 15


def _texts(value, out: list[str]) -> list[str]:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _texts(v, out)
    elif isinstance(value, list):
        for v in value:
            _texts(v, out)
    return out


def verbatim(bodies: list[dict | None], rules: list[str]) -> tuple[float, float]:
    """(mean share of rules present word for word, worst request's share) over ``bodies``
    (None: a rejected request, share 0)."""
    shares = []
    for body in bodies:
        text = "\n".join(_texts(body, [])) if body is not None else ""
        shares.append(sum(rule in text for rule in rules) / len(rules))
    return (sum(shares) / len(shares), min(shares)) if shares else (float("nan"), float("nan"))


async def run_mode(mode: str, formats: list[str], seeds: list[int], rounds: int) -> dict:
    policy = {"pinned_ratio": 0.0} if mode == "unpinned" else {}
    bench = await Bench.start(gateway=mode != "direct", policy=policy)
    base = bench.gateway.base_url if bench.gateway else bench.puppet.base_url
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        try:
            for fmt in formats:
                for seed in seeds:
                    bench.puppet.reset()
                    session, rules = standing_session(seed, rounds=rounds)
                    sid = f"standing-{fmt}-{seed}" if bench.gateway else None
                    statuses = await play(http, base, fmt, session, sid, key=API_KEY, model=MODEL)
                    if bench.gateway:
                        await bench.gateway.settle()
                    if mode == "direct":
                        sent = [r for r in bench.puppet.received if r["path"].endswith(ROUTES[fmt])]
                        bodies = [r["json"] if status == 200 else None for r, status in zip(sent, statuses)]
                    else:
                        bodies = [r["json"] for r in bench.puppet.received if r["path"].endswith(ROUTES[fmt])
                                  and r["headers"].get("x-palimpsest-purpose") != "summary"]
                    share, worst = verbatim(bodies[-LATE:], rules)
                    rows.append({"format": fmt, "seed": seed, "requests": len(statuses),
                                 "rejected": sum(s != 200 for s in statuses), "verbatim": share, "worst": worst})
            checks = {}
            if bench.gateway:
                for family in bench.gateway.app[__import__("gateway.keys", fromlist=["METRICS"]).METRICS].registry.collect():
                    for sample in family.samples:
                        if sample.name == "palimpsest_summary_checks_total" and sample.value:
                            checks[sample.labels["outcome"]] = int(sample.value)
                        elif sample.name == "palimpsest_summary_check_problems_total" and sample.value:
                            checks["problem " + sample.labels["problem"]] = int(sample.value)
        finally:
            await bench.stop()
    return {"mode": mode, "rows": rows, "checks": checks}


# --- false positives on real data -------------------------------------------------------------


def false_positives() -> dict:
    from policies.messages import content_text
    from policies.pinned import rule_ops

    parts = {"tune": {"turns": 0, "pinned": 0, "examples": []}, "held-out": {"turns": 0, "pinned": 0, "examples": []}}

    def count(part: str, source: str, text: str) -> None:
        parts[part]["turns"] += 1
        adds = [op for op in rule_ops(text) if op.op in ("add", "file")]
        parts[part]["pinned"] += len(adds)
        parts[part]["examples"] += [(source, op.text[:140]) for op in adds]

    for i, record in enumerate(json.loads(Path(TAU).read_text())):
        for message in record["traj"]:
            if message.get("role") == "user":
                count("held-out" if i % 3 == 0 else "tune", "tau", content_text(message.get("content")))
    for i, path in enumerate(sorted(glob.glob(f"{LONGMEMEVAL}/*.json"))):
        case = json.loads(Path(path).read_text())
        for session in case["haystack_sessions"]:
            for message in session:
                if message["role"] == "user":
                    count("held-out" if i % 3 == 0 else "tune", "lme", message["content"])
    return parts


# --- report -----------------------------------------------------------------------------------


def render(results: list[dict], fp: dict) -> str:
    lines = []
    if results:
        lines += ["Standing instructions verbatim in the last 15 upstream requests (fake-32k, 3 rules per session)", "",
                  "| format | " + " | ".join(f"{r['mode']} mean | {r['mode']} worst | {r['mode']} rejected" for r in results) + " |",
                  "|---|" + "---|---|---|" * len(results)]
        formats = list(dict.fromkeys(row["format"] for r in results for row in r["rows"]))
        for fmt in [*formats, "all"]:
            cells = []
            for r in results:
                rows = [row for row in r["rows"] if fmt in ("all", row["format"])]
                mean = sum(row["verbatim"] for row in rows) / len(rows) if rows else float("nan")
                worst = min((row["worst"] for row in rows), default=float("nan"))
                rejected = sum(row["rejected"] for row in rows)
                cells.append(f"{mean:.2f} | {worst:.2f} | {rejected}")
            lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
        lines.append("")
        for r in results:
            if r["mode"] != "direct":
                lines.append(f"summary checks ({r['mode']}): " + (", ".join(f"{k} {v}" for k, v in sorted(r["checks"].items())) or "none"))
        lines.append("")
    if fp:
        lines += ["Rules pinned by mistake (every detected rule counted), per 100 user turns", "",
                  "| split | user turns | pinned | per 100 turns |", "|---|---|---|---|"]
        for part, f in fp.items():
            lines.append(f"| {part} | {f['turns']} | {f['pinned']} | {100 * f['pinned'] / max(1, f['turns']):.3f} |")
        lines += ["", "held-out pins, for reading:"] + [f"  [{s}] {t}" for s, t in fp["held-out"]["examples"]]
    return "\n".join(lines)


async def main_async(args) -> None:
    results = []
    if not args.fp_only:
        for mode in args.modes.split(","):
            results.append(await run_mode(mode, args.formats.split(","), [int(s) for s in args.seeds.split(",")], args.rounds))
    fp = false_positives() if not args.no_fp else {}
    print(render(results, fp))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--formats", default="chat,responses,messages")
    parser.add_argument("--modes", default="direct,unpinned,pinned")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--fp-only", action="store_true")
    parser.add_argument("--no-fp", action="store_true")
    args = parser.parse_args(argv)
    quiet_logs()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
