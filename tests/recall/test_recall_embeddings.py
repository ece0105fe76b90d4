"""A configured /v1/embeddings endpoint drives recall end to end.

The simulated upstream serves /v1/embeddings and records every request; here its vectors are
made *meaningful* by one middleware: a toy concept model in which "uvicorn" and "ASGI",
"pinned" and "locked" share a dimension, the way a real sentence model puts a paraphrase next
to its fact. The paraphrased question shares no word with the fact, while a decoy turn shares
three, so BM25 alone ranks the decoy first: the fact can only come first through the endpoint's
vectors and the ranking a configured model gets (`REAL_MODEL_RANKING`).
"""

from __future__ import annotations

import dataclasses
import json
import re

import openai
import orjson
import pytest
from aiohttp import web

from gateway.keys import INDEXER, LEDGER, PIPELINE
from simulator.puppet import create_puppet_app
from tests.conftest import Upstream, _serve

FACT = "Pinned runtime: uvicorn 0.30.1 behind port 8443."
DECOY = "The release server was locked during the freeze, so nothing shipped that week."
QUESTION = "Which release of the ASGI server are we locked to?"
# Toy concepts: synonyms share a dimension; every other word adds to one shared "other" axis.
CONCEPTS = {"uvicorn": 0, "asgi": 0, "gunicorn": 0, "pinned": 1, "locked": 1, "pin": 1,
            "freeze": 2, "frozen": 2, "shipped": 3, "deploy": 3, "week": 4, "weekly": 4}
DIM = 8


def concept_vector(text: str) -> list[float]:
    row = [0.0] * DIM
    for word in re.findall(r"[a-z]+", text.lower()):
        row[CONCEPTS.get(word, DIM - 1)] += 1.0
    row[DIM - 1] = min(row[DIM - 1], 1.0)  # "other words" count once: they carry no meaning here
    norm = sum(v * v for v in row) ** 0.5 or 1.0
    return [v / norm for v in row]


@web.middleware
async def concept_embeddings(request: web.Request, handler):
    """The puppet answers (and records) the request; its hash-seeded vectors are replaced."""
    response = await handler(request)
    if not request.path.endswith("/embeddings") or response.status != 200:
        return response
    body = orjson.loads(await request.read())
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    payload = orjson.loads(response.body)
    for item, text in zip(payload["data"], inputs):
        item["embedding"] = concept_vector(text)
    return web.json_response(payload)


@pytest.fixture
async def upstream():  # overrides tests/conftest.py's: the same puppet, with meaningful vectors
    app = create_puppet_app(windows={"fake-32k": 32_000, "fake-8k": 8_000})
    app.middlewares.insert(0, concept_embeddings)
    runner, port = await _serve(app)
    yield Upstream(app, runner, f"http://127.0.0.1:{port}/v1")
    await runner.cleanup()


def history() -> list[dict]:
    turns = [{"role": "user", "content": "Hi, let's plan the service upgrade."},
             {"role": "assistant", "content": "Sure."},
             {"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": DECOY}, {"role": "assistant", "content": "Understood."}]
    for n in range(6):  # long turns push the opening out of an 8k view
        text = f"Notes part {n}: " + " ".join(["harbour lantern meadow copper violet"] * 180)
        turns += [{"role": "user", "content": text}, {"role": "assistant", "content": f"noted part {n}"}]
    return turns


async def test_paraphrase_found_through_the_configured_embeddings_endpoint(start_gateway, upstream):
    # The plain ratios: the history is compacted (and recall offered) though a view this short
    # would not repay the rewrite.
    gw = await start_gateway(recall={"embeddings_url": upstream.base_url, "embeddings_model": "concept-embed",
                                     "embeddings_dim": DIM}, policy={"cost_model": False})
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0,
                                default_headers={"X-Session-Id": "emb-e2e"})
    turns = history()
    reply = await client.chat.completions.create(
        model="fake-8k", messages=turns + [{"role": "user", "content": f"RECALL: {QUESTION}"}], max_tokens=100)

    # The puppet searched with the question and answered from the top hit: the fact.
    assert "0.30.1" in reply.choices[0].message.content
    calls = [r for r in upstream.received if r["path"].endswith("/embeddings")]
    assert calls and all(r["json"]["model"] == "concept-embed" for r in calls)
    embedded = [text for r in calls for text in r["json"]["input"]]
    assert any(FACT in text for text in embedded) and QUESTION in embedded

    # The gateway's own search ranks the fact's event first; BM25 alone prefers the decoy.
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    by_text = {e.message.get("content"): e.id for e in ledger.since(key, -1)
               if not str(e.message.get("content")).startswith("RECALL:")}  # the question's own turn
    search = {"id": "s", "type": "function", "function": {
        "name": "session_search", "arguments": json.dumps({"query": QUESTION, "scope": "session"})}}
    found = orjson.loads(await gw.app[PIPELINE].loop.tools.run(
        search, kind="search", session_key=key, path_ids=list(by_text.values()), hidden=frozenset()))
    assert found["results"][0]["event_id"] == by_text[FACT]
    # The configured model's vectors alone rank the fact first (no BM25 leg, no kind leg, no
    # answer-type prior). BM25 no longer prefers the decoy: the fact's line is indexed with
    # the kind words of its version ("version release", store/kinds.py).
    index = await gw.app[INDEXER].opened()
    vectors_only = dataclasses.replace(index.ranking, text_weight=0.0, kind_weight=0.0, answer_type=0.0)
    ranked = await index.search(key, QUESTION, within=frozenset(by_text.values()), ranking=vectors_only)
    assert ranked[0].event_id == by_text[FACT] and ranked[0].score > 0
