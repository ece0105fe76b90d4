"""BodyReader (gateway/http/upstream.py): what has arrived is read without a timer; a read that
must wait is bounded by the first-byte timeout, then by the idle timeout."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest import mock

import pytest
from aiohttp import streams

from gateway.http import upstream
from gateway.http.upstream import BodyReader


def reader(first_byte_s: float = 0.05, idle_s: float = 0.05) -> tuple[BodyReader, streams.StreamReader]:
    protocol = mock.Mock(_reading_paused=False)
    content = streams.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    return BodyReader(SimpleNamespace(content=content), first_byte_s, idle_s), content


async def test_what_has_arrived_is_read_without_arming_a_timer(monkeypatch):
    body, content = reader()
    content.feed_data(b'{"id": "a",')
    content.feed_data(b' "ok": true}')
    content.feed_eof()
    monkeypatch.setattr(upstream.asyncio, "timeout", mock.Mock(side_effect=AssertionError("a timer was armed")))
    assert await body.read() == b'{"id": "a", "ok": true}'
    assert await body.chunk() == b""


async def test_a_read_that_waits_is_timed_first_byte_then_idle():
    body, content = reader(first_byte_s=0.05, idle_s=0.2)
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, content.feed_data, b"first")
    assert await body.chunk() == b"first"  # came within the first-byte timeout
    loop.call_later(0.1, content.feed_data, b"second")  # later than first_byte_s, within idle_s
    assert await body.chunk() == b"second"
    with pytest.raises(TimeoutError):
        await body.chunk()  # nothing more, no end: the idle timeout
    content.feed_eof()
    assert await body.chunk() == b""
