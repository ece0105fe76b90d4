"""``palimpsest replay`` of stored sessions: honesty and speed (issue 27).

For each wire format a synthetic agent session (tests/cli/test_replay.py's driver: a tool
call and its result per round) runs live through a real gateway (profile economy) in front of the
SIMULATED upstream; its bill is read from the gateway's counters of the usage the simulator
reported (its own prompt cache). Then the session is replayed FROM THE STORE the live gateway
left (gateway/cli/replay_sources.py: ledger plus the turn log's request forms) with the live
profile and the others, and the figures are compared:

- billed ratio of the live profile, replay vs live (target: within 10%),
- client prompt tokens, replay vs what the client sent (target: within 2%),
- requests per minute of the replay itself (target: about 1,000 on this machine for a 32k model),
  every profile's requests counted, the baseline pass included in the time.

    python bench/replay.py [--rounds 24] [--formats chat,responses,messages] [--profiles economy,balanced,fidelity,direct]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.cli.replay import RATES, replay  # noqa: E402
from gateway.cli.replay_sources import ReplayRequest, stored_requests  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from tests.cli.test_replay import LIVE, MODEL, _args, _live  # noqa: E402


async def one(fmt: str, rounds: int, profiles: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    _, live = await _live(fmt, tmp, MODEL, rounds)
    stored = stored_requests(load_settings(None, store={"path": str(tmp / "live")}), None, [])
    requests = [ReplayRequest(s, f, b, t) for t, s, f, b in stored.requests]
    with open(os.devnull, "w") as quiet:
        started = time.perf_counter()
        result = await replay(requests, _args(tmp / "unused", profiles), err=quiet)
        elapsed = time.perf_counter() - started
    profile = next(p for p in result["profiles"] if p["profile"] == LIVE)
    read, _ = RATES["openai"]
    cached = live["upstream_usage_cached_tokens_total"] + live["summary_cache_read_tokens_total"]
    prompt = live["upstream_usage_prompt_tokens_total"] + live["summary_input_tokens_total"]
    live_ratio = (prompt - cached + read * cached) / profile["billed_direct"]
    return {"format": fmt, "requests": len(requests), "approximate": stored.approximate,
            "live_ratio": live_ratio, "replay_ratio": profile["billed_ratio"],
            "ratio_error": abs(profile["billed_ratio"] - live_ratio) / live_ratio,
            "client_sent": live["client_sent"], "client_replay": profile["client_prompt_tokens"],
            "client_error": abs(profile["client_prompt_tokens"] - live["client_sent"]) / live["client_sent"],
            "summary_calls": profile["summary_calls"], "seconds": elapsed,
            "per_minute": len(requests) * len(profiles) / elapsed * 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=24, help="Rounds of the synthetic session (2 requests each).")
    parser.add_argument("--formats", default="chat,responses,messages")
    parser.add_argument("--profiles", default=f"{LIVE},balanced,fidelity,direct")
    args = parser.parse_args()
    profiles = [p for p in args.profiles.split(",") if p]
    if LIVE not in profiles:
        profiles.insert(0, LIVE)
    rows = [asyncio.run(one(fmt, args.rounds, profiles)) for fmt in args.formats.split(",")]
    print(f"model {MODEL}, live profile {LIVE}, profiles replayed: {', '.join(profiles)}; "
          f"{args.rounds} rounds per session; the SIMULATED upstream")
    print(f"{'format':<10}{'requests':>9}{'approx':>7}{'live ratio':>11}{'replay':>8}{'error':>8}"
          f"{'client sent':>13}{'replayed':>10}{'error':>8}{'summaries':>10}{'req/min':>9}")
    for r in rows:
        print(f"{r['format']:<10}{r['requests']:>9}{r['approximate']:>7}{r['live_ratio']:>11.4f}{r['replay_ratio']:>8.4f}"
              f"{r['ratio_error']:>8.2%}{r['client_sent']:>13,.0f}{r['client_replay']:>10,}{r['client_error']:>8.2%}"
              f"{r['summary_calls']:>10}{r['per_minute']:>9,.0f}")


if __name__ == "__main__":
    main()
