"""A format's requests on an upstream that serves only Chat Completions (``[models."x"] api = "chat"``).

llama.cpp, vLLM's older builds and many hosted OpenAI-compatible APIs serve neither
``/v1/responses`` nor ``/v1/messages``. For a model configured so, the pipeline and the
recall loop talk to a ``ChatTransport`` instead of the upstream: it takes the body the format
would have sent, has the format render it as a Chat Completions body, posts that, and has the
format translate the answer back (a JSON object, or the chunk stream event by event), so the
client sees the API it spoke. What the chat upstream cannot take is left out and named in the
``x-palimpsest-dropped`` response header (``kind=count, ...``).

The format's part is four methods: ``convert`` (body -> chat body and what was dropped),
``answer`` (a chat completion -> the format's answer object), ``events`` (the chunk stream ->
the format's event stream) and ``error`` (the upstream's error body in the format's envelope).
This module is format-neutral: the Responses and Messages translations live in their rooms.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.http.upstream import BodyReader
from gateway.pipeline.relay import upstream_events


@dataclass
class Translated:
    """The upstream's answer as the client's format: what ``post`` yields in place of a response."""

    status: int
    reason: str | None
    headers: CIMultiDict
    chunks: AsyncIterator[bytes]  # the body for the client, translated as it arrives


def dropped_header(dropped: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(dropped.items()))


def count(dropped: dict[str, int], kind: object, n: int = 1) -> None:
    dropped[str(kind)] = dropped.get(str(kind), 0) + n


class ChatTransport:
    """The upstream seen through Chat Completions: ``post`` and ``reader`` as ``Upstream`` has them."""

    def __init__(self, upstream) -> None:
        self.upstream = upstream
        self.name = upstream.name

    # -- the format's own ------------------------------------------------------------------

    def convert(self, request: dict) -> tuple[dict, dict[str, int]]:
        raise NotImplementedError

    def answer(self, completion: dict, request: dict) -> dict:
        raise NotImplementedError

    def events(self, reader, request: dict) -> AsyncIterator[bytes]:
        raise NotImplementedError

    def error(self, status: int, payload: bytes) -> bytes:
        return payload

    def incoming(self, headers: CIMultiDictProxy[str]) -> CIMultiDictProxy[str] | CIMultiDict[str]:
        """The client's headers as the chat upstream should see them."""
        return headers

    # -- shared ------------------------------------------------------------------------------

    @asynccontextmanager
    async def post(self, path: str, incoming, body: bytes, *, drop: frozenset[str], tenant_key: str = ""):
        request = orjson.loads(body)
        converted, dropped = self.convert(request)
        async with self.upstream.post_chat(self.incoming(incoming), orjson.dumps(converted), drop=drop,
                                           tenant_key=tenant_key) as up:
            headers = CIMultiDict(up.headers)
            if dropped:
                headers["x-palimpsest-dropped"] = dropped_header(dropped)
            reader = self.upstream.reader(up)
            if up.status == 200 and "text/event-stream" in up.headers.get("Content-Type", ""):
                headers["Content-Type"] = "text/event-stream"
                yield Translated(200, up.reason, headers, self.events(reader, request))
                return
            payload = await reader.read()
            if up.status == 200:
                try:
                    payload = orjson.dumps(self.answer(orjson.loads(payload), request))
                except (orjson.JSONDecodeError, AttributeError, TypeError, IndexError, KeyError):
                    pass  # relayed as it came, like any answer the gateway cannot read
            else:
                payload = self.error(up.status, payload)
            headers["Content-Type"] = up.headers.get("Content-Type", "application/json")
            yield Translated(up.status, up.reason, headers, once(payload))

    def reader(self, translated: Translated) -> "Reader":
        return Reader(translated.chunks)


class Reader(BodyReader):
    """A translated body read like ``BodyReader`` (its ``read``): ``chunk`` (b"" at the end)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks

    async def chunk(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""


async def once(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def translated_stream(reader, writer, error_event) -> AsyncIterator[bytes]:
    """A chat upstream's stream as the client's format: each chunk through `writer` (its format's
    event writer: ``chunk``, ``close`` and the ``assembler`` it reads with), the provider's error
    event through `error_event` (its error object -> the format's bytes), and the closing events
    once the stream said it was complete ([DONE] or a finish reason)."""
    done = False
    async for _, events in upstream_events(reader):  # parsed chunks and "[DONE]"; what does not parse is skipped
        out = bytearray()
        for event in events:
            if event == "[DONE]":
                done = True
            elif isinstance(event.get("error"), dict) and not event.get("choices"):
                out += error_event(event["error"])
            else:
                out += writer.chunk(event)
        if out:
            yield bytes(out)
    if done or writer.assembler.finish_reason is not None:
        yield writer.close()


def arguments_object(arguments: object) -> dict:
    """A chat tool call's JSON arguments as an object ({} when they are not one)."""
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
