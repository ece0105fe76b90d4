"""Proactive recall cannot pile up searches.

A search that outlives its request (recall.auto_timeout_s) finishes in the background. Under
bench/load.py every search was late, each request of a busy session started one more, and
~4,400 of them were in flight after 220 s, with the gateway's native memory (LanceDB queries)
growing along. While a late search of a session still runs, later requests of that session skip
the search (outcome=busy) and go on without the block.
"""

from __future__ import annotations

import asyncio

from gateway.keys import METRICS, PIPELINE
from simulator.workloads import TOOL_SPECS
from tests.recall.test_recall import client, long_history
from tests.recall.test_recall_auto import blocks, forwarded


async def drained(gw) -> None:
    """Wait for late searches (a cold index's first ones may outlive 0.2 s) to end."""
    late = gw.app[PIPELINE].loop.tools.late_searches
    for _ in range(400):
        if not late:
            break
        await asyncio.sleep(0.05)
    assert not late


def outcome(registry, name: str) -> float:
    return registry.get_sample_value("palimpsest_recall_calls_total", {"tool": "auto", "outcome": name}) or 0


async def test_a_session_with_a_late_search_starts_no_other_until_it_ends(start_gateway, upstream):
    gw = await start_gateway(recall={"auto_tokens": 800, "auto_timeout_s": 0.2})
    s, history = await long_history(gw, session="auto-backlog")
    await drained(gw)
    tools = gw.app[PIPELINE].loop.tools
    registry = gw.app[METRICS].registry
    real, release, started = tools.find, asyncio.Event(), []

    async def stuck_find(*args, **kwargs):  # an index far behind: the search outlives its request
        started.append(args[0])
        await release.wait()
        return await real(*args, **kwargs)

    tools.find = stuck_find
    timeouts, busy = outcome(registry, "timeout"), outcome(registry, "busy")
    for n in range(4):
        question = {"role": "user", "content": f"Quick check before we go on ({n}): {s.facts[1].question}"}
        r = await client(gw, "auto-backlog").chat.completions.create(model="fake-32k", messages=history + [question],
                                                                     tools=TOOL_SPECS)
        assert r.choices[0].message.content  # every request is answered, without the block
    assert len(started) == 1, "one search in flight for the session, not one per request"
    assert outcome(registry, "timeout") == timeouts + 1
    assert outcome(registry, "busy") == busy + 3
    assert len(tools.late_searches) == 1

    # Once the late search ends, the session searches again (and finds the hidden fact).
    release.set()
    await drained(gw)
    tools.find = real
    n_before = len(upstream.chat_requests())
    question = {"role": "user", "content": f"Quick check before we go on: {s.facts[1].question}"}
    await client(gw, "auto-backlog").chat.completions.create(model="fake-32k", messages=history + [question], tools=TOOL_SPECS)
    found = blocks(forwarded(upstream, n_before)[0])
    assert found and s.facts[1].answer in found[0][1]


async def test_other_sessions_still_search_while_one_is_behind(start_gateway, upstream):
    # The behind session's search waits out the timeout; the other session's first search must
    # come back within it, so the timeout is generous (a fresh session's first search can take
    # longer than 0.2 s on a loaded machine) and a search queued behind the stuck one still fails.
    gw = await start_gateway(recall={"auto_tokens": 800, "auto_timeout_s": 5.0})
    slow, slow_history = await long_history(gw, session="auto-behind")
    fast, fast_history = await long_history(gw, session="auto-fine")
    await drained(gw)
    tools = gw.app[PIPELINE].loop.tools
    real, release, behind = tools.find, asyncio.Event(), []

    async def find(session_key, *args, **kwargs):
        behind[:] = behind or [session_key]  # the first request's session is the one behind
        if session_key == behind[0]:
            await release.wait()
        return await real(session_key, *args, **kwargs)

    tools.find = find
    try:
        question = {"role": "user", "content": slow.facts[1].question}
        await client(gw, "auto-behind").chat.completions.create(model="fake-32k", messages=slow_history + [question],
                                                                tools=TOOL_SPECS)
        n_before = len(upstream.chat_requests())
        question = {"role": "user", "content": f"Quick check before we go on: {fast.facts[1].question}"}
        await client(gw, "auto-fine").chat.completions.create(model="fake-32k", messages=fast_history + [question],
                                                              tools=TOOL_SPECS)
        found = blocks(forwarded(upstream, n_before)[0])
        assert found and fast.facts[1].answer in found[0][1]
    finally:
        release.set()
        await drained(gw)
