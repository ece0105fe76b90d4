"""A search hit's passage shows the line of a tool result that ranked it (Hit.line), not the
densest cluster of a query word that the output's filler repeats. The conversation goes
through the gateway over HTTP (ledger and LanceDB index as in production), then session_search
runs as the recall loop runs it."""

from __future__ import annotations

import random

import openai
import orjson

from gateway.keys import LEDGER, PIPELINE

FACT = "NOTE Customer reservation code is ZFA04Y, booked under Mara Quist."
WORDS = "harbour lantern meadow copper violet thunder pebble orchard canyon glacier saffron compass".split()


def tool_output() -> str:
    rng = random.Random(5)
    lines = [f"2024-06-01T10:{n:02d} INFO client: client request " + " ".join(rng.choices(WORDS, k=6))
             for n in range(30)]
    lines += [f"2024-06-02T11:{n:02d} INFO worker: " + " ".join(rng.choices(WORDS, k=8)) for n in range(50)]
    lines.insert(70, FACT)
    return "\n".join(lines)


async def test_the_passage_of_a_log_hit_holds_the_line_that_matched(start_gateway):
    gw = await start_gateway()
    call = {"id": "call_1", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}
    history = [{"role": "user", "content": "Read the booking service log."},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": tool_output()},
               {"role": "assistant", "content": "Read it."}]
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": "passage"},
                                max_retries=0)
    await client.chat.completions.create(model="fake-32k", messages=[*history, {"role": "user", "content": "thanks"}])
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    ids = [e.id for e in ledger.since(key, -1) if e.kind == "message"]
    search = {"id": "c1", "type": "function", "function": {
        "name": "session_search", "arguments": orjson.dumps({"query": "Which booking reference did the client have?"}).decode()}}
    result = orjson.loads(await gw.app[PIPELINE].loop.tools.run(
        search, kind="search", session_key=key, path_ids=ids, hidden=frozenset(ids)))
    top = result["results"][0]
    assert top["role"] == "tool" and top["total_chars"] > len(top["passage"])
    assert FACT in top["passage"]


def numbered_list() -> str:
    rng = random.Random(7)
    items = [f"{n}. {' '.join(rng.choices(WORDS, k=5)).capitalize()} (e.g., {', '.join(rng.choices(WORDS, k=3))})"
             for n in range(1, 41)]
    items[26] = "27. Sound effects (e.g., ambient, diegetic, non-diegetic)"
    return "Sure, here are 40 prompt parameters you can specify to influence my output:\n\n" + "\n".join(items)


async def test_the_passage_of_a_long_list_holds_the_entry_asked_for_by_position(start_gateway):
    """"The 27th parameter on that list": the query's words cluster in the list's introduction;
    the passage shows the 27th entry instead (store.passages.numbered_item)."""
    gw = await start_gateway()
    history = [{"role": "user", "content": "Give me a list of 40 prompt parameters to influence your output."},
               {"role": "assistant", "content": numbered_list()}]
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": "list"},
                                max_retries=0)
    await client.chat.completions.create(model="fake-32k", messages=[*history, {"role": "user", "content": "thanks"}])
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    ids = [e.id for e in ledger.since(key, -1) if e.kind == "message"]
    search = {"id": "c1", "type": "function", "function": {"name": "session_search", "arguments": orjson.dumps(
        {"query": "What was the 27th parameter on the list of prompt parameters you gave me?"}).decode()}}
    result = orjson.loads(await gw.app[PIPELINE].loop.tools.run(
        search, kind="search", session_key=key, path_ids=ids, hidden=frozenset(ids)))
    hit = next(r for r in result["results"] if r["role"] == "assistant")
    assert hit["total_chars"] > len(hit["passage"])
    assert "27. Sound effects (e.g., ambient, diegetic, non-diegetic)" in hit["passage"]
