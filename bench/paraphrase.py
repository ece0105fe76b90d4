"""Paraphrased questions by a fixed rule: questions that share (almost) no content word with the fact.

Rule, applied to a question and the statement of the fact it asks about: every content word of
the question whose stem occurs in the statement is replaced by its nearest whole-word neighbour
in WordLlama's token-embedding table (l2_supercat, the wheel's own weights) that shares neither
its first four letters nor a stem with any word of the statement; a word without such a
neighbour among the nearest NEIGHBOURS (a rare word: a product name) stays, so a paraphrase
shares few words with the fact, and only words no substitute exists for. Words the statement does not use stay. The
rule reads no case of the benchmark and no answer; its only resource is a general English
embedding table, so it cannot be tuned to the cases.

Caveat when reading figures: WordLlama is also the gateway's default embedder, so its vector leg
sees these substitutes as close by construction (an advantage for WordLlama); BM25 sees none of
the replaced words.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.chunking import query_terms  # noqa: E402
from store.passages import stem  # noqa: E402

NEIGHBOURS = 12
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


@lru_cache(maxsize=1)
def _table():
    from store.embedders import WordLlamaEmbedder

    model = WordLlamaEmbedder()._loaded()
    vectors = np.asarray(model.embedding, dtype=np.float32)
    vocab = model.tokenizer.get_vocab()
    whole = [(i, t[1:]) for t, i in vocab.items() if t[:1] in ("Ġ", "▁") and re.fullmatch(r"[a-z]{4,}", t[1:])]
    ids = np.asarray([i for i, _ in whole])
    table = vectors[ids] / np.linalg.norm(vectors[ids], axis=1, keepdims=True)
    return vocab, vectors, table, [w for _, w in whole]


def neighbour(word: str, avoid: set[str]) -> str | None:
    """The nearest whole word to `word` sharing neither its first four letters nor a stem in `avoid`."""
    vocab, vectors, table, words = _table()
    token = vocab.get("▁" + word.lower()) or vocab.get("Ġ" + word.lower())
    if token is None:
        return None
    v = vectors[token] / np.linalg.norm(vectors[token])
    for j in np.argsort(-(table @ v))[: NEIGHBOURS + 1]:
        candidate = words[j]
        if candidate[:4] == word.lower()[:4] or stem(candidate) in avoid:
            continue
        return candidate
    return None


def reworded(question: str, statement: str) -> str:
    """`question` with the words it shares with `statement` replaced by the rule."""
    avoid = {stem(t) for t in query_terms(statement)}
    content = set(query_terms(question))

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        if word.lower() not in content or stem(word.lower()) not in avoid:
            return word
        return neighbour(word, avoid) or word

    return " ".join(_WORD.sub(swap, question).split())


if __name__ == "__main__":
    from simulator.workloads import synthetic_session

    for fact in synthetic_session(0, rounds=14).facts:
        print(f"{fact.question!r} -> {reworded(fact.question, fact.statement)!r}  (fact: {fact.statement})")
