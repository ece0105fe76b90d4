import logging
import sys

import numpy as np
import pytest

from store.embedders import Embedder, HashingEmbedder, WordLlamaEmbedder, default_embedder


def unit_rows(vectors: np.ndarray) -> bool:
    return bool(np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5))


async def test_wordllama_loads_packaged_weights_and_normalises():
    embedder = WordLlamaEmbedder()

    vectors = await embedder.embed(["my daughter's violin recital", "a kid's music performance",
                                    "quarterly tax filing deadline"])

    assert isinstance(embedder, Embedder)
    assert (embedder.name, embedder.dim) == ("wordllama/l2_supercat/256", 256)
    assert vectors.dtype == np.float32 and vectors.shape == (3, 256)
    assert unit_rows(vectors)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


async def test_wordllama_embeds_nothing_without_loading():
    embedder = WordLlamaEmbedder()

    assert (await embedder.embed([])).shape == (0, 256)
    assert embedder._model is None


async def test_wordllama_weights_load_once_per_process():
    """Every embedder of a config reads one copy of the weights: a process that starts several
    gateways (each with its own embedder) does not load, and fragment, one copy per gateway."""
    first, second = WordLlamaEmbedder(), WordLlamaEmbedder()
    a, b = await first.embed(["the parcel code"]), await second.embed(["the parcel code"])
    assert first._model is not None and first._model is second._model
    np.testing.assert_array_equal(a, b)


async def test_hashing_embedder_is_deterministic_and_normalised():
    first, second = HashingEmbedder(dim=64), HashingEmbedder(dim=64)

    a = await first.embed(["reservation code ZFA04Y", "reservation code ZFA04Y", "garden"])
    b = await second.embed(["reservation code ZFA04Y"])

    assert a.dtype == np.float32 and a.shape == (3, 64)
    assert unit_rows(a)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0] @ a[1] == pytest.approx(1.0)
    assert a[0] @ a[2] < 0.5


async def test_hashing_embedder_keeps_blank_text_as_zero_vector():
    vectors = await HashingEmbedder(dim=16).embed(["", "word"])

    assert not np.isnan(vectors).any()
    assert np.linalg.norm(vectors[0]) == 0.0


def test_default_embedder_prefers_wordllama():
    assert isinstance(default_embedder(), WordLlamaEmbedder)


def test_default_embedder_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wordllama", None)  # makes `import wordllama` fail

    with caplog.at_level(logging.WARNING, logger="store.embedders"):
        embedder = default_embedder()

    assert isinstance(embedder, HashingEmbedder)
    assert "WordLlama is unavailable" in caplog.text


def test_a_configured_embedding_model_brings_its_own_ranking(tmp_path):
    from gateway.recall.embeddings import REAL_MODEL_RANKING, RemoteEmbedder
    from store.index import SearchIndex
    from store.ranking import Ranking

    remote = SearchIndex(str(tmp_path / "a"), RemoteEmbedder(None, "http://x/v1", "m", "", 8))
    assert remote.ranking == REAL_MODEL_RANKING and REAL_MODEL_RANKING.text_scale > 0
    assert SearchIndex(str(tmp_path / "b"), HashingEmbedder()).ranking == Ranking()
