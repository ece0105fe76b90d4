"""A scripted agent client: replays a synthetic session through the official openai SDK."""

from __future__ import annotations

import openai

from gateway.workloads import TOOL_SPECS, SyntheticSession


async def drive(client: openai.AsyncOpenAI, session: SyntheticSession, *, model: str, rounds: int | None = None,
                messages: list[dict] | None = None, stream: bool = False) -> tuple[list[dict], list]:
    """Play `rounds` rounds; returns the history (as a client keeps it) and raw responses."""
    history = messages if messages is not None else [{"role": "system", "content": session.system}]
    raw = []
    for spec in session.rounds[: rounds if rounds is not None else len(session.rounds)]:
        history.append({"role": "user", "content": spec["user"]})
        first = await client.chat.completions.with_raw_response.create(model=model, messages=history, tools=TOOL_SPECS)
        raw.append(first)
        message = first.parse().choices[0].message
        assert message.tool_calls, message
        history.append(message.model_dump(exclude_none=True))
        history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": spec["output"]})
        second = await client.chat.completions.with_raw_response.create(model=model, messages=history, tools=TOOL_SPECS)
        raw.append(second)
        history.append(second.parse().choices[0].message.model_dump(exclude_none=True))
    return history, raw
