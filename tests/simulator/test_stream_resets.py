"""The puppet's scripted stream faults on its three streaming routes: ``[[die N]]`` resets the
connection after N events (no end of the body, no final event), and ``stream_faults`` arms one
fault for the next streamed answer only, so the same request answers whole the second time."""

from __future__ import annotations

import aiohttp
import pytest

from simulator.puppet import PUPPET_STATE

ROUTES = {
    "chat": ("/chat/completions", lambda text: {"model": "fake-8k", "stream": True,
                                                 "messages": [{"role": "user", "content": text}]}, b"data: [DONE]"),
    "responses": ("/responses", lambda text: {"model": "fake-8k", "stream": True, "store": False, "input": text},
                  b"response.completed"),
    "messages": ("/messages", lambda text: {"model": "fake-8k", "stream": True, "max_tokens": 100,
                                            "messages": [{"role": "user", "content": text}]}, b"message_stop"),
}


async def read(http, url: str, body: dict) -> tuple[list[bytes], bool]:
    """(the data lines read, whether the body ended cleanly)."""
    lines, whole = [], True
    async with http.post(url, json=body, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}) as response:
        assert response.status == 200
        try:
            async for line in response.content:
                if line.startswith(b"data: "):
                    lines.append(line.strip())
        except aiohttp.ClientPayloadError:
            whole = False
    return lines, whole


@pytest.mark.parametrize("route", list(ROUTES))
async def test_die_resets_the_stream_after_n_events(puppet, http, route):
    path, body, end = ROUTES[route]
    lines, whole = await read(http, puppet[1] + path, body("a longer answer, please [[die 3]]"))
    assert not whole and len(lines) == 3
    assert not any(end in line for line in lines)


@pytest.mark.parametrize("route", list(ROUTES))
async def test_an_armed_fault_hits_the_next_stream_only(puppet, http, route):
    path, body, end = ROUTES[route]
    puppet[0][PUPPET_STATE].stream_faults.append(("die", 2))
    lines, whole = await read(http, puppet[1] + path, body("hello there"))
    assert not whole and len(lines) == 2
    lines, whole = await read(http, puppet[1] + path, body("hello there"))
    assert whole and any(end in line for line in lines)
    assert puppet[0][PUPPET_STATE].stream_faults == []
