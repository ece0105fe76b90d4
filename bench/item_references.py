"""What reading ``item_reference`` items back from the ledger costs a request (branch aisdk).

    python -m bench.item_references [--turns 60] [--repeat 3]

A Responses conversation in the shape the Vercel AI SDK sends with ``store: true``: turn k is
``[user 1, item_reference(answer 1), ..., user k]``, every earlier answer by reference. Figures:
the client's request time (gateway + simulated upstream, loopback) at the last 10 turns, p50 and
max, and whether the session stayed one branch in the ledger. Run it on this branch and on a
worktree of main (the "before") in one sitting.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp

from bench.common import Bench, machine_note, quiet_logs
from gateway.keys import LEDGER


async def run(turns: int) -> tuple[list[float], int]:
    bench = await Bench.start(models={"fake-32k": {"context_window": 2_000_000}})
    gw = bench.gateway
    times: list[float] = []
    items: list[dict] = []
    try:
        async with aiohttp.ClientSession() as http:
            for k in range(turns):
                items.append({"role": "user", "content": f"turn {k}: " + "please look at the build log again " * 20})
                started = time.perf_counter()
                async with http.post(f"{gw.base_url}/responses", headers={"X-Session-Id": "refs"},
                                     json={"model": "fake-32k", "input": items, "store": True}) as r:
                    body = await r.json()
                    assert r.status == 200, body
                times.append(time.perf_counter() - started)
                message = next(i for i in body["output"] if i["type"] == "message")
                items.append({"type": "item_reference", "id": message["id"]})
        await gw.settle()
        ledger = gw.app[LEDGER]
        heads = len(ledger.heads(gw.session_key("refs")))
    finally:
        await bench.stop()
    return times[-10:], heads


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    quiet_logs()
    last: list[float] = []
    heads = 0
    for _ in range(args.repeat):
        times, heads = await run(args.turns)
        last += times
    print(f"{machine_note()}\nturns {args.turns}, last 10 x {args.repeat}: p50 {statistics.median(last) * 1000:.1f} ms, "
          f"max {max(last) * 1000:.1f} ms, ledger heads {heads}")


if __name__ == "__main__":
    asyncio.run(main())
