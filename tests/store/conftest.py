"""Fixtures shared by the recall-index tests: one WordLlama per module, an index per test."""

from __future__ import annotations

import pytest

from store.embedders import WordLlamaEmbedder
from store.index import SearchIndex


@pytest.fixture(scope="module")
def embedder() -> WordLlamaEmbedder:
    return WordLlamaEmbedder()


@pytest.fixture
async def index(tmp_path, embedder):
    index = SearchIndex(str(tmp_path / "index"), embedder)
    yield index
    index.close()
