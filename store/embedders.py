"""Text embedders for the recall index.

An `Embedder` turns texts into L2-normalised float32 vectors of a fixed `dim`. Three
implementations exist:

- `WordLlamaEmbedder` — the embedded default. Its weights ship inside the `wordllama` wheel, so
  recall works offline; it never downloads anything.
- `HashingEmbedder` — a deterministic feature-hashing fallback, used only when WordLlama cannot
  be imported. Keyword search still works through BM25; vector recall degrades to lexical overlap.
- the OpenAI-compatible `/v1/embeddings` client, which lives in `gateway/` because it does
  network I/O. It implements the same Protocol.

A vector index is only meaningful for one embedder: `name` identifies it (model and dim), so the
caller can tell when an index was built with a different one and must be rebuilt.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from wordllama.inference import WordLlamaInference

__all__ = ["Embedder", "HashingEmbedder", "WordLlamaEmbedder", "default_embedder", "normalise"]

logger = logging.getLogger(__name__)

EMBED_BATCH = 16  # texts per WordLlama call (its own default is 64; see WordLlamaEmbedder)


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Return a float32 array of shape (len(texts), dim) with unit-length rows."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows as float32; an all-zero row (nothing to embed) stays zero, not NaN."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


# WordLlama models by (config, dim), loaded once per process: their weights are only read, so
# every embedder of a config shares one copy. A process that starts several gateways (tests,
# benchmarks) loaded ~30 MB and ~0.4 s per gateway that searched, and the copies freed with a
# closed gateway fragmented the heap rather than returning to the kernel.
_WORDLLAMA_MODELS: dict[tuple[str, int], WordLlamaInference] = {}
_WORDLLAMA_LOCK = threading.Lock()


class WordLlamaEmbedder:
    """WordLlama static token embeddings, mean-pooled: ~0.5 ms per query on one core.

    The model loads on first use, not at construction, so building the gateway stays fast and
    a process that never searches never pays for it; it is shared by every embedder of the same
    config in the process. Loading is guarded by a lock because the first embeds may arrive
    concurrently from several worker threads.
    """

    def __init__(self, config: str = "l2_supercat", dim: int = 256) -> None:
        self.dim = dim
        self.name = f"wordllama/{config}/{dim}"
        self._config = config
        self._model: WordLlamaInference | None = None

    def _loaded(self) -> WordLlamaInference:
        if self._model is None:
            with _WORDLLAMA_LOCK:
                model = _WORDLLAMA_MODELS.get((self._config, self.dim))
                if model is None:
                    wordllama = _import_wordllama()

                    # The weights and tokenizer are package data; never reach for Hugging Face.
                    model = _WORDLLAMA_MODELS[(self._config, self.dim)] = wordllama.WordLlama.load(
                        config=self._config,
                        dim=self.dim,
                        cache_dir=os.path.dirname(wordllama.__file__),
                        disable_download=True,
                    )
                self._model = model
        return self._model

    def _embed_blocking(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._loaded()
        # WordLlama pads a batch to its longest text and gathers a (texts, tokens, dim) float32
        # array, then a second one for the masked sum: 64 chunks of ~500 tokens held ~70 MB per
        # call, in worker threads' heaps. Batches of EMBED_BATCH texts of similar
        # length keep that to a few MB; padding adds zeros only, so the vectors are the same.
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), EMBED_BATCH):
            rows = order[start : start + EMBED_BATCH]
            vectors[rows] = model.embed([texts[i] for i in rows], norm=False, batch_size=EMBED_BATCH)
        return normalise(vectors)

    async def embed(self, texts: list[str]) -> np.ndarray:
        return await asyncio.to_thread(self._embed_blocking, texts)


_WORD = re.compile(r"\w+")


class HashingEmbedder:
    """Feature hashing of lower-cased word unigrams and bigrams into `dim` signed buckets.

    Deterministic across processes (blake2b, not Python's salted `hash`), so an index built by
    one run is searchable by the next.
    """

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing/{dim}"

    def _row(self, text: str) -> np.ndarray:
        row = np.zeros(self.dim, dtype=np.float32)
        words = _WORD.findall(text.lower())
        for feature in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            row[bucket] += 1.0 if digest[4] & 1 else -1.0
        return row

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise(np.stack([self._row(text) for text in texts]))


def _import_wordllama():
    """Import wordllama without letting it reconfigure logging.

    Its import calls ``logging.basicConfig(level=INFO)``, which would make every library in a
    process that has not set up logging yet (``palimpsest reindex``, library use) log at INFO.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return wordllama


def default_embedder() -> Embedder:
    """WordLlama when it is importable, else the hashing fallback (with a warning saying why)."""
    try:
        _import_wordllama()
    except ImportError as exc:
        logger.warning(
            "WordLlama is unavailable (%s); recall falls back to the hashing embedder, "
            "so paraphrased queries will match poorly",
            exc,
        )
        return HashingEmbedder()
    return WordLlamaEmbedder()
