"""Deterministic figures for the pass-through overhead (issue 25): Python calls and thread hops
per request, counted with cProfile, on ``bench/overhead.py``'s workloads.

    python bench/overhead_calls.py --api responses --body-kb 500 --n 30
    python bench/overhead_calls.py --api chat --n 150 --top 30      # and the top functions

The gateway runs in this process (``create_app``, the same settings as overhead.py's), the
simulated upstream in its own (``python -m simulator.puppet``), and the client is overhead.py's
``one_request`` (the same bodies, sessions and checks). After ``--warmup`` requests, the
profiler counts N: calls of functions in ``gateway/``, ``store/`` and ``policies/`` of the tree
imported (run it with ``PYTHONPATH`` set to the tree to measure), all calls of the process
(the client's included), and the worker-thread hops (``asyncio.to_thread``; the work in them is
profiled too). Call counts do not move with the machine's load, unlike overhead.py's
latencies; the times printed beside them do.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
# The tree measured: PYTHONPATH's when set, else this checkout (bench/common.py puts its root
# first on sys.path unless it is there already).
if os.environ.get("PYTHONPATH"):
    sys.path.append(str(_HERE.parent))
import aiohttp  # noqa: E402

import overhead as ov  # noqa: E402
from common import _serve  # noqa: E402

OURS = ("/gateway/", "/store/", "/policies/")
_thread_profiles: list[cProfile.Profile] = []
_profiling = [False]
_to_thread = asyncio.to_thread


async def _profiled_to_thread(fn, /, *args, **kwargs):
    """asyncio.to_thread with the worker's work profiled (cProfile sees one thread only)."""
    if not _profiling[0]:
        return await _to_thread(fn, *args, **kwargs)

    def run():
        profile = cProfile.Profile()
        profile.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            profile.disable()
            _thread_profiles.append(profile)

    return await _to_thread(run)


async def measure(args: argparse.Namespace) -> None:
    from gateway.app import create_app
    from gateway.settings import load_settings

    work = Path(tempfile.mkdtemp(prefix="overhead-calls-"))
    puppet = ov.start_puppet(work)
    try:
        settings = load_settings(None, upstream={"base_url": puppet.base_url, "api_key": ov.API_KEY},
                                 tenants={"bench": ov.API_KEY}, store={"path": str(work / "store")},
                                 log={"level": "WARNING"}, limits={"requests_per_minute": 0})
        runner, port = await _serve(create_app(settings))
        target = ov.Target("palimpsest", f"http://127.0.0.1:{port}/v1", api=args.api)
        profile = cProfile.Profile()
        async with aiohttp.ClientSession() as http:
            not_ready = await ov.wait_ready(http, puppet)
            if not_ready is not None:
                raise SystemExit(f"the simulated upstream: {not_ready}")
            for i in range(args.warmup):
                await ov.one_request(http, target, i, f"bench-seq-{i}")
            _thread_profiles.clear()
            _profiling[0] = True
            profile.enable()
            for i in range(args.warmup, args.warmup + args.n):
                await ov.one_request(http, target, i, f"bench-seq-{i}")
            profile.disable()
            _profiling[0] = False
        await runner.cleanup()
    finally:
        ov.stop(puppet.proc)
    stats = pstats.Stats(profile)
    for extra in _thread_profiles:
        stats.add(extra)
    if args.dump:
        stats.dump_stats(args.dump)
    root = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(ov.REPO)
    ours, per_file, rows = 0, {}, []
    for (filename, line, name), (_, calls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(part in filename for part in OURS) and "site-packages" not in filename:
            ours += calls
            short = filename.split(root)[-1]
            per_file[short] = per_file.get(short, 0) + calls
            rows.append((tottime, calls, f"{short}:{line}({name})"))
    n = args.n
    print(f"{args.api} route, ~{args.body_kb} KB history, {n} requests after {args.warmup}: "
          f"Python calls per request in gateway/store/policies {ours / n:.0f}, in the process {stats.total_calls / n:.0f} "  # type: ignore[attr-defined]
          f"(client included); worker-thread hops per request {len(_thread_profiles) / n:.2f}")
    for short, calls in sorted(per_file.items(), key=lambda item: -item[1])[:12]:
        print(f"  {calls / n:8.1f}  {short}")
    if args.top:
        print("top functions of gateway/store/policies by own time (ms per request, noisy):")
        for tottime, calls, where in sorted(rows, reverse=True)[:args.top]:
            print(f"  {tottime / n * 1e3:7.3f} ms  {calls / n:6.1f} calls  {where}")
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    parser.add_argument("--body-kb", type=int, default=0)
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--model", help="the model asked for (default: overhead.py's)")
    parser.add_argument("--top", type=int, default=0, help="also list the top functions by own time")
    parser.add_argument("--tool-tail", action="store_true", help="end each request in a tool output (overhead.py's)")
    parser.add_argument("--dump", help="also write the merged profile here (pstats; for its callers)")
    args = parser.parse_args()
    ov.BODY_KB = args.body_kb
    ov.TOOL_TAIL = args.tool_tail
    ov.MODEL = args.model or (ov.big_model(args.body_kb) if args.body_kb else ov.MODEL)
    asyncio.to_thread = _profiled_to_thread  # type: ignore[assignment]
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
