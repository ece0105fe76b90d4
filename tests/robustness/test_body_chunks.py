"""`read_bounded` (gateway/http/body.py): the body is its chunks joined once (one chunk is returned
as it came, not copied), within the size limit, and the event loop gets in after every STEP of
bytes read while readany keeps answering from buffered input."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http import body as body_mod
from gateway.http.body import BodyLimits, read_bounded
from gateway.http.errors import PayloadTooLarge


class Chunks:
    """A StreamReader whose input is all buffered already: readany never waits."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)
        self.total_raw_bytes = sum(map(len, chunks))

    def set_read_chunk_size(self, n: int) -> None:
        pass

    async def readany(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


async def test_one_chunk_is_the_body_as_it_came():
    chunk = b'{"input": "' + b"x" * 500_000 + b'"}'
    content = Chunks([chunk])
    assert await read_bounded(content, BodyLimits(content, 1 << 30, 100)) is chunk


async def test_many_chunks_are_joined_and_the_loop_gets_in_every_step(monkeypatch):
    monkeypatch.setattr(body_mod, "STEP", 1000)
    chunks = [bytes([65 + i % 26]) * 300 for i in range(20)]  # 6,000 bytes: 6 steps
    content = Chunks(chunks)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    got = await read_bounded(content, BodyLimits(content, 1 << 30, 100))
    task.cancel()
    assert got == b"".join(chunks)
    assert ticks - before >= 5  # let in at least once a step (buffered input never waits)


async def test_the_size_limit_still_holds_per_chunk():
    content = Chunks([b"x" * 600, b"x" * 600])
    with pytest.raises(PayloadTooLarge):
        await read_bounded(content, BodyLimits(content, 1000, 100))
