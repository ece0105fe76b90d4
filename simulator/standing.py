"""Sessions in which the user sets standing instructions early: the workload of the pinned-block
benchmark (bench/standing.py) and its tests.

A 60-round tool-heavy session (``simulator.workloads.synthetic_session``) whose user states
``rules`` rules in early rounds ("From now on, never run database migrations against the ...
cluster without my written approval."), each a sentence of its own in front of that round's
request. Deterministic for a seed: the rules and their values come from it. ``play`` replays
such a session as a client of any of the three wire formats would, over raw HTTP.
"""

from __future__ import annotations

import random

import aiohttp
import orjson

from simulator.workloads import TOOL_SPECS, WORDS, SyntheticSession, synthetic_session

ROUTES = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in TOOL_SPECS]
MESSAGES_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOL_SPECS]

_RULES = (
    "From now on, never run database migrations against the {word} cluster without my written approval.",
    "Always sign every commit message with \"Reviewed-by: {name}\".",
    "Do not ever edit files under /srv/app/{word}/ without asking me first.",
    "Going forward, keep every answer under {n} words and write in British English.",
    "Never push to the release-{n} branch directly; open a pull request instead.",
    "You must always run the {word} test suite before you report a task as done.",
    "For the rest of this session, prefix every shell command you propose with `set -euo pipefail;`.",
)
_NAMES = ("Ada Okafor", "Lin Zhou", "Maren Holt", "Teo Brandt", "Sana Iqbal")


def standing_session(seed: int = 0, rounds: int = 60, rules: int = 3, first_round: int = 1,
                     **kwargs) -> tuple[SyntheticSession, list[str]]:
    """The session and its rule sentences (verbatim, in the order stated)."""
    rng = random.Random(f"standing-{seed}")
    session = synthetic_session(seed, rounds=rounds, **kwargs)
    chosen = rng.sample(_RULES, rules)
    sentences = [t.format(word=rng.choice(WORDS), name=rng.choice(_NAMES), n=rng.randint(100, 400)) for t in chosen]
    for i, sentence in enumerate(sentences):
        spec = session.rounds[first_round + 2 * i]
        spec["user"] = f"{sentence} {spec['user']}"
    return session, sentences


class Player:
    """A client of one format: the request body for its history, and what an answer adds to it."""

    def __init__(self, fmt: str, system: str, model: str = "fake-32k") -> None:
        self.fmt = fmt
        self.model = model
        self.system = system
        self.items: list[dict] = [{"role": "system", "content": system}] if fmt == "chat" else []
        if fmt == "responses":
            self.items = [{"type": "message", "role": "developer", "content": system}]

    def user(self, text: str) -> None:
        if self.fmt == "responses":
            self.items.append({"type": "message", "role": "user", "content": text})
        else:
            self.items.append({"role": "user", "content": text})

    def body(self) -> dict:
        if self.fmt == "chat":
            return {"model": self.model, "messages": self.items, "tools": TOOL_SPECS}
        if self.fmt == "responses":
            return {"model": self.model, "input": self.items, "tools": RESPONSES_TOOLS, "store": False}
        return {"model": self.model, "max_tokens": 1024, "system": self.system, "messages": self.items, "tools": MESSAGES_TOOLS}

    def answer(self, data: dict, output: str) -> bool:
        """Add the answer (and, when it called a tool, the tool's output); True if it did."""
        if self.fmt == "chat":
            message = {k: v for k, v in data["choices"][0]["message"].items() if v is not None}
            self.items.append(message)
            calls = message.get("tool_calls") or []
            for call in calls[:1]:
                self.items.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            return bool(calls)
        if self.fmt == "responses":
            out = data.get("output") or []
            self.items.extend(out)
            calls = [i for i in out if i.get("type") == "function_call"]
            for call in calls[:1]:
                self.items.append({"type": "function_call_output", "call_id": call["call_id"], "output": output})
            return bool(calls)
        content = data.get("content") or []
        self.items.append({"role": "assistant", "content": content})
        calls = [b for b in content if b.get("type") == "tool_use"]
        if calls:
            self.items.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"],
                                                            "content": output}]})
        return bool(calls)


async def play(http: aiohttp.ClientSession, base: str, fmt: str, session, sid: str | None, *, key: str = "sk-client",
               model: str = "fake-32k", rounds: int | None = None) -> list[int]:
    """Play the session over raw HTTP at ``base`` (ending in /v1): per round the request that
    calls the tool, then the one after its result. The statuses of the requests in order."""
    player = Player(fmt, session.system, model)
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key, "anthropic-version": "2023-06-01",
               "Content-Type": "application/json"}
    if sid:
        headers["X-Session-Id"] = sid
    statuses = []
    for spec in session.rounds[:rounds]:
        if fmt == "messages" and player.items and player.items[-1]["role"] == "user":
            player.items[-1] = {"role": "user", "content": [*_blocks(player.items[-1]["content"]),
                                                            {"type": "text", "text": spec["user"]}]}
        else:
            player.user(spec["user"])
        for _ in range(2):  # the tool call, then the answer after its result
            async with http.post(base + ROUTES[fmt], data=orjson.dumps(player.body()), headers=headers) as resp:
                statuses.append(resp.status)
                data = await resp.json(content_type=None) if resp.status == 200 else None
            if data is None or not player.answer(data, spec["output"]):
                break
    return statuses


def _blocks(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
