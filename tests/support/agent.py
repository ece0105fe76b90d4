"""A scripted agent client: replays a synthetic session through the official openai SDK."""

from __future__ import annotations

import asyncio

import openai

from simulator.workloads import TOOL_SPECS, AgentLoopSession, SyntheticSession


async def drive(client: openai.AsyncOpenAI, session: SyntheticSession, *, model: str, rounds: int | None = None,
                messages: list[dict] | None = None, stream: bool = False, after=None) -> tuple[list[dict], list]:
    """Play `rounds` rounds; returns the history (as a client keeps it) and raw responses.
    `after()`, if given, is awaited after every response (a test's wait for background jobs)."""
    history = messages if messages is not None else [{"role": "system", "content": session.system}]
    raw = []
    for spec in session.rounds[: rounds if rounds is not None else len(session.rounds)]:
        history.append({"role": "user", "content": spec["user"]})
        first = await client.chat.completions.with_raw_response.create(model=model, messages=history, tools=TOOL_SPECS)
        raw.append(first)
        if after is not None:
            await after()
        message = first.parse().choices[0].message
        assert message.tool_calls, message
        history.append(message.model_dump(exclude_none=True))
        history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": spec["output"]})
        second = await client.chat.completions.with_raw_response.create(model=model, messages=history, tools=TOOL_SPECS)
        raw.append(second)
        if after is not None:
            await after()
        history.append(second.parse().choices[0].message.model_dump(exclude_none=True))
    return history, raw


async def settle(gw, timeout_s: float = 10.0) -> None:
    """Wait until the gateway's summary jobs are done (tests want determinism, not speed)."""
    from gateway.keys import SUMMARIZER

    summarizer = gw.app[SUMMARIZER]
    for _ in range(int(timeout_s / 0.05)):
        if summarizer.idle:
            return
        await asyncio.sleep(0.05)


async def drive_loop(client: openai.AsyncOpenAI, session: AgentLoopSession, *, model: str, turns: int | None = None,
                     messages: list[dict] | None = None) -> tuple[list[dict], list]:
    """Play an agent-loop session: per turn one user message, then a request after every tool
    result until the model answers in text. Returns the history and the raw responses."""
    history = messages if messages is not None else [{"role": "system", "content": session.system}]
    raw = []
    for turn in session.turns[: turns if turns is not None else len(session.turns)]:
        history.append({"role": "user", "content": turn["user"]})
        steps = iter(turn["steps"])
        while True:
            response = await client.chat.completions.with_raw_response.create(model=model, messages=history, tools=TOOL_SPECS)
            raw.append(response)
            message = response.parse().choices[0].message
            history.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            step = next(steps)
            assert message.tool_calls[0].function.name == step["tool"], message
            history.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": step["output"]})
    return history, raw


RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in TOOL_SPECS]


async def responses_turn(client: openai.AsyncOpenAI, items: list[dict], *, model: str, stream: bool = False,
                         tools: list[dict] | None = None, **extra) -> tuple[list[dict], object]:
    """One Responses call as Codex makes it (store false, the whole input every time): the
    output items as the client keeps them, and the response."""
    kw = dict(model=model, input=items, tools=RESPONSES_TOOLS if tools is None else tools, store=False,
              include=["reasoning.encrypted_content"], **extra)
    if not stream:
        response = await client.responses.create(**kw)
    else:
        response = None
        async with client.responses.stream(**kw) as events:
            async for _ in events:
                pass
            response = await events.get_final_response()
    return [item.model_dump(exclude_none=True) for item in response.output], response


async def drive_responses_loop(client: openai.AsyncOpenAI, session: AgentLoopSession, *, model: str,
                               stream: bool = False, items: list[dict] | None = None) -> tuple[list[dict], list]:
    """An agent-loop session over the Responses API: per turn one user message, then a call
    after every tool output until the model answers in text. Returns the items and responses."""
    items = items if items is not None else [{"type": "message", "role": "developer", "content": session.system}]
    responses = []
    for turn in session.turns:
        items.append({"type": "message", "role": "user", "content": turn["user"]})
        steps = iter(turn["steps"])
        while True:
            output, response = await responses_turn(client, items, model=model, stream=stream)
            responses.append(response)
            items.extend(output)
            calls = [i for i in output if i["type"] == "function_call"]
            if not calls:
                break
            step = next(steps)
            assert calls[0]["name"] == step["tool"], calls
            items.append({"type": "function_call_output", "call_id": calls[0]["call_id"], "output": step["output"]})
    return items, responses
