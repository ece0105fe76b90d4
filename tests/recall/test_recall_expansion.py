"""session_search expands a paraphrased query with the summary's entity names
(store/query_expansion.py): the conversation goes through the gateway over HTTP (ledger and
LanceDB index as in production), then the recall tool runs as the recall loop runs it, with
the summary and entities a view carries."""

from __future__ import annotations

import random

import openai
import orjson

from gateway.keys import LEDGER, PIPELINE
from store.query_expansion import summary_entities

FACT = "Opened OPS-7731 to track it; it is due 2024-07-19."
DISTRACTORS = [
    "Which credentials does the CI runner use for the artifact cache? Changing them needs a restart.",
    "The staging DB credentials live in the vault; changing them is done by the platform team.",
    "I created a dashboard for the staging DB latency.",
]
SUMMARY = ("## Decisions\n- The user opened ticket OPS-7731 to track the staging database password rotation.\n"
           "- Dashboards are owned by the platform team.")
# Names no kind of value: "which issue number" would find the ticket by its kind words alone
# (store/kinds.py, tests/store/test_kinds.py), without the summary.
QUERY = "What did I set up for changing the staging DB credentials?"
WORDS = "harbour lantern meadow copper violet thunder pebble orchard canyon glacier saffron compass".split()


def conversation() -> list[dict]:
    rng = random.Random(7)
    turns: list[dict] = []
    for n in range(12):
        turns.append({"role": "user", "content": f"Notes {n}: " + " ".join(rng.choice(WORDS) for _ in range(60))})
        turns.append({"role": "assistant", "content": f"noted {n}"})
        if n == 4:
            turns += [{"role": "user", "content": "We must rotate the staging database password."},
                      {"role": "assistant", "content": FACT}]
        if n in (2, 6, 9):
            turns += [{"role": "user", "content": DISTRACTORS[(n // 3) % 3]}, {"role": "assistant", "content": "ok"}]
    return turns


async def ranked(gw, history: list[dict], *, summary: str | None) -> list[str]:
    ledger = gw.app[LEDGER]
    key = ledger.sessions()[0].key
    ids = [e.id for e in ledger.since(key, -1) if e.kind == "message"]
    tools = gw.app[PIPELINE].loop.tools
    entities = summary_entities(summary, {"ids": ["OPS-7731"]}) if summary else ()
    call = {"id": "c1", "type": "function", "function": {"name": "session_search",
                                                         "arguments": orjson.dumps({"query": QUERY}).decode()}}
    result = orjson.loads(await tools.run(call, kind="search", session_key=key, path_ids=ids,
                                          hidden=frozenset(ids), summary=summary, entities=entities))
    texts = {e.id: e.message.get("content") for e in ledger.get_many(key, ids)}
    return [texts[hit["event_id"]] for hit in result["results"]]


async def test_a_paraphrase_finds_the_fact_by_the_entity_the_summary_names(start_gateway):
    gw = await start_gateway()
    history = conversation()
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": "expand"},
                                max_retries=0)
    await client.chat.completions.create(model="fake-32k", messages=[*history, {"role": "user", "content": "thanks"}])
    plain = await ranked(gw, history, summary=None)
    expanded = await ranked(gw, history, summary=SUMMARY)
    # The entity took the keyword leg to the event holding it: it is among the hits that carry
    # a passage (the best three), where without expansion it is not found at all.
    assert FACT in expanded[:3]
    assert FACT not in plain


async def test_expansion_can_be_turned_off(start_gateway):
    gw = await start_gateway(recall={"expand_queries": False})
    history = conversation()
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": "expand"},
                                max_retries=0)
    await client.chat.completions.create(model="fake-32k", messages=[*history, {"role": "user", "content": "thanks"}])
    assert await ranked(gw, history, summary=SUMMARY) == await ranked(gw, history, summary=None)



async def test_a_summary_line_that_only_lists_values_expands_nothing(start_gateway):
    # The value list's paths hold the query's words ("staging", "credentials"); linked to the
    # query through them, its ids used to take the keyword leg to whatever event named them.
    listing = "## Values\n- OPS-7731, /srv/staging/credentials/db.yaml, /srv/staging/ci/runner.py"
    gw = await start_gateway()
    history = conversation()
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-a", default_headers={"X-Session-Id": "expand"},
                                max_retries=0)
    await client.chat.completions.create(model="fake-32k", messages=[*history, {"role": "user", "content": "thanks"}])
    assert gw.app[PIPELINE].loop.tools.expansion(QUERY, listing, summary_entities(listing, {"ids": ["OPS-7731"]})) == ""
    assert await ranked(gw, history, summary=listing) == await ranked(gw, history, summary=None)
