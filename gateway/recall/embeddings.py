"""The configurable embedder: any OpenAI-compatible /v1/embeddings endpoint.

It lives in gateway/ because it does network I/O; it implements store.embedders.Embedder.
"""

from __future__ import annotations

import orjson

from store.ranking import REAL_MODEL_RANKING

__all__ = ["REAL_MODEL_RANKING", "RemoteEmbedder"]


class RemoteEmbedder:
    def __init__(self, upstream, base_url: str, model: str, api_key: str, dim: int) -> None:
        self._upstream = upstream
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = model
        self._key = api_key
        self.dim = dim
        self.name = f"openai-compatible:{model}:{dim}"
        self.ranking = REAL_MODEL_RANKING  # SearchIndex's default for this embedder

    async def embed(self, texts: list[str]):
        import numpy as np

        from store.embedders import normalise

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        body = orjson.dumps({"model": self._model, "input": texts})
        async with self._upstream.request(self._upstream.api, "POST", self._url, data=body, headers=headers) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"embeddings endpoint answered {resp.status}")
        rows = sorted(orjson.loads(payload)["data"], key=lambda d: d.get("index", 0))
        vectors = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
        if vectors.shape[1] != self.dim:
            raise RuntimeError(f"embeddings have {vectors.shape[1]} dimensions, configured {self.dim}")
        return normalise(vectors)
