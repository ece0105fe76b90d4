"""Builders for synthetic OpenAI conversations used across the policy tests."""

from __future__ import annotations

import json


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, calls: list[tuple[str, str, dict]] | None = None) -> dict:
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls
        ]
    return message


def result(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def payload(words: int, seed: int = 0) -> str:
    """Filler of roughly ``words`` tokens that differs by seed (so caches do not collide)."""
    return " ".join(f"line{seed}_{i} value" for i in range(words // 3 + 1))


def agent_round(index: int, tools: int = 1, result_words: int = 600, tool_name: str = "read_file") -> list[dict]:
    """One round: a user ask, tool calls with results, a final assistant answer."""
    calls = [(f"call_{index}_{t}", tool_name, {"path": f"/src/mod{index}_{t}.py"}) for t in range(tools)]
    messages = [user(f"Step {index}: please inspect the module"), assistant(None, calls)]
    messages += [result(cid, payload(result_words, seed=index * 100 + t)) for t, (cid, _, _) in enumerate(calls)]
    messages.append(assistant(f"Done with step {index}."))
    return messages


def session(rounds: int, **kwargs) -> list[dict]:
    messages: list[dict] = []
    for index in range(rounds):
        messages += agent_round(index, **kwargs)
    return messages


def ids_for(messages: list[dict], prefix: str = "evt") -> list[str]:
    return [f"{prefix}{i}" for i in range(len(messages))]
