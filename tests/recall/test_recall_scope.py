"""Recall reads only the request's own conversation.

Two people behind one key who both open with "Hi" share a session under the fingerprint
fallback: their conversations are two branches of one session. Search and load must only ever
see the caller's own path.
"""

from __future__ import annotations

import json
import random

import openai
import orjson

from gateway.keys import LEDGER, PIPELINE

SECRET = "My bank PIN is 4417 and my IBAN is DE89 3704 0044 0532 0130 00."
WORDS = ("harbour lantern meadow copper violet thunder pebble orchard canyon glacier saffron "
         "compass falcon juniper marble quartz tundra velvet willow zephyr").split()


def filler(seed: int, paragraphs: int) -> list[dict]:
    """Long user paragraphs with short answers: enough to push the opening out of an 8k view."""
    rng = random.Random(seed)
    turns = []
    for n in range(paragraphs):
        text = f"Notes part {n}: " + " ".join(rng.choice(WORDS) for _ in range(900))
        turns += [{"role": "user", "content": text}, {"role": "assistant", "content": f"noted part {n}"}]
    return turns


def headerless(gw) -> openai.AsyncOpenAI:
    # No X-Session-Id: the session comes from the fingerprint of the first message.
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-shared", max_retries=0)


async def test_second_user_with_same_opening_cannot_recall_the_first_users_secret(start_gateway, upstream):
    gw = await start_gateway(session={"fallback": "fingerprint"})
    opening = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    alice = opening + [{"role": "user", "content": SECRET}, {"role": "assistant", "content": "Noted."}] + filler(1, 6)
    bob = opening + [{"role": "user", "content": "I am planning a garden."}, {"role": "assistant", "content": "Nice."}] + filler(2, 6)
    ask = {"role": "user", "content": "RECALL: What is my bank PIN and IBAN?"}

    # Alice's own recall works (the secret is hidden from her view, and found).
    r = await headerless(gw).chat.completions.create(model="fake-8k", messages=alice + [ask], max_tokens=100)
    assert "4417" in r.choices[0].message.content
    n_before = len(upstream.chat_requests())
    r = await headerless(gw).chat.completions.with_raw_response.create(model="fake-8k", messages=bob + [ask], max_tokens=100)
    answer = r.parse().choices[0].message.content

    ledger = gw.app[LEDGER]
    assert len(ledger.sessions()) == 1  # one session, two branches: the case being tested
    assert int(r.headers["x-palimpsest-recall-calls"]) >= 1  # Bob's model did search
    assert "4417" not in answer and "DE89" not in answer
    upstream_text = json.dumps([q["json"] for q in upstream.chat_requests()[n_before:]])
    assert "4417" not in upstream_text and "DE89" not in upstream_text

    # Loading Alice's event by id from Bob's path is refused like a missing one.
    key = ledger.sessions()[0].key
    secret_id = next(e.id for e in ledger.since(key, -1) if e.message.get("content") == SECRET)
    from store.canonical import path_ids

    bob_path = path_ids(bob + [ask])
    tools = gw.app[PIPELINE].loop.tools
    load = {"id": "l", "type": "function", "function": {"name": "session_load", "arguments": json.dumps({"event_id": secret_id})}}
    loaded = orjson.loads(await tools.run(load, kind="load", session_key=key, path_ids=bob_path, hidden=frozenset(bob_path)))
    assert "error" in loaded and "4417" not in json.dumps(loaded)
    # Whole-path scope does not reach the other branch either.
    search = {"id": "s", "type": "function", "function": {"name": "session_search", "arguments": json.dumps({"query": "bank PIN IBAN", "scope": "session"})}}
    found = orjson.loads(await tools.run(search, kind="search", session_key=key, path_ids=bob_path, hidden=frozenset()))
    assert secret_id not in {h["event_id"] for h in found["results"]}
    assert "4417" not in json.dumps(found)


async def test_configured_embeddings_endpoint_is_used_end_to_end(start_gateway, upstream):
    """recall.embeddings_url points at the simulated upstream's /v1/embeddings: the index and
    every search embed through it (its vectors are hash-seeded, so BM25 finds the fact)."""
    gw = await start_gateway(session={"fallback": "fingerprint"}, recall={
        "embeddings_url": upstream.base_url, "embeddings_model": "fake-embed", "embeddings_dim": 64})
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "The gate code for the warehouse is 7719-KESTREL."},
               {"role": "assistant", "content": "Noted."}] + filler(3, 6)
    r = await headerless(gw).chat.completions.create(
        model="fake-8k", messages=history + [{"role": "user", "content": "RECALL: What is the warehouse gate code?"}],
        max_tokens=100)
    assert "7719-KESTREL" in r.choices[0].message.content
    calls = [q for q in upstream.received if q["path"].endswith("/embeddings")]
    assert calls and all(q["json"]["model"] == "fake-embed" for q in calls)
    embedded = [text for q in calls for text in q["json"]["input"]]
    assert any("7719-KESTREL" in t for t in embedded)  # the index was built with it
    assert "What is the warehouse gate code?" in embedded  # and the query embedded with it
