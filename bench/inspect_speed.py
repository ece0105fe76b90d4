"""How long ``palimpsest inspect SESSION`` takes on a large session (target: ≤ 1 s for 500 messages).

Builds a store with one session of ``--rounds`` agent rounds (4 messages each: user, tool call,
tool result, answer; 125 rounds = 500 messages plus the system prompt) by replaying the bundled
synthetic session through a real gateway in front of the SIMULATED upstream (the puppet), all
on loopback. The gateway learns the model's window (32k) from the puppet's /v1/models, as it
would from a real provider. Then it runs ``palimpsest inspect`` as a user would, in a fresh
process, with a config that names the store only (no upstream, no [models]): the figures show
what the command costs and which window and budget it reports.

    .venv/bin/python bench/inspect_speed.py                 # ~1-2 minutes on 2 CPUs
    .venv/bin/python bench/inspect_speed.py --rounds 40 --reps 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import openai  # noqa: E402
from aiohttp import web  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from simulator.puppet import start_puppet  # noqa: E402
from simulator.workloads import TOOL_SPECS, synthetic_session  # noqa: E402

MODEL = "fake-32k"
SESSION = "inspect-bench"


async def build_store(store: Path, rounds: int) -> int:
    """Replay `rounds` rounds through a gateway; returns the number of messages sent."""
    puppet, puppet_url = await start_puppet(keep_received=10)
    settings = load_settings(None, upstream={"base_url": puppet_url},
                             store={"path": str(store)}, log={"level": "ERROR"})
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    session = synthetic_session(seed=11, rounds=rounds)
    history: list[dict] = [{"role": "system", "content": session.system}]
    try:
        async with openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0, timeout=120,
                                      default_headers={"X-Session-Id": SESSION}) as client:
            for spec in session.rounds:
                history.append({"role": "user", "content": spec["user"]})
                first = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOL_SPECS)
                message = first.choices[0].message
                history.append(message.model_dump(exclude_none=True))
                history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": spec["output"]})
                second = await client.chat.completions.create(model=MODEL, messages=history, tools=TOOL_SPECS)
                history.append(second.choices[0].message.model_dump(exclude_none=True))
    finally:
        await runner.cleanup()  # drains summary jobs, closes the store
        await puppet.cleanup()
    return len(history) - 1


def run_inspect(config: Path, *extra: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds (user + system of the child) and the finished process."""
    exe = shutil.which("palimpsest") or str(Path(sys.executable).with_name("palimpsest"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([exe, "inspect", "--config", str(config), *extra], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=125)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the store directory")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # WordLlama's import configures INFO logging on the root logger
    work = Path(tempfile.mkdtemp(prefix="palimpsest-inspect-bench-"))
    try:
        store = work / "store"
        started = time.perf_counter()
        messages = asyncio.run(build_store(store, args.rounds))
        print(f"store: one session of {messages} messages built in {time.perf_counter() - started:.1f}s ({store})")
        config = work / "inspect.toml"
        config.write_text(f'[store]\npath = "{store}"\n')
        rows = []
        for label, extra in (("inspect SESSION", ()), ("inspect SESSION --json", ("--json",)),
                             ("inspect SESSION --view", ("--view",)), ("inspect (list)", ())):
            argv = (*extra,) if label == "inspect (list)" else (SESSION, *extra)
            times, cpus = [], []
            for _ in range(args.reps):
                elapsed, cpu, done = run_inspect(config, *argv)
                if done.returncode != 0:
                    print(f"{label}: exit {done.returncode}\n{done.stderr[-2000:]}")
                    return 1
                times.append(elapsed)
                cpus.append(cpu)
            rows.append((label, statistics.median(times), max(times), statistics.median(cpus)))
        _, _, done = run_inspect(config, SESSION, "--json")
        basis = json.loads(done.stdout)["basis"]
        load = os.getloadavg()[0]
        print(f"\n{'command':<28} {'wall p50 s':>10} {'wall max s':>10} {'CPU p50 s':>9}   (load average {load:.1f}, "
              f"{os.cpu_count()} CPUs)")
        for label, median, worst, cpu in rows:
            print(f"{label:<28} {median:>10.2f} {worst:>10.2f} {cpu:>9.2f}")
        print(f"\nreported basis: model {basis['model']} ({basis['model_source']}), window {basis['window']}, "
              f"budget {basis['budget']} (the gateway used window 32000)")
        for what, value in (("wall", rows[0][1]), ("CPU", rows[0][3])):
            print(f"target: inspect of a {messages}-message session ≤ 1 s ({what}): "
                  f"{'met' if value <= 1.0 else 'NOT met'} ({value:.2f} s median)")
        return 0
    finally:
        if args.keep:
            print(f"store kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
