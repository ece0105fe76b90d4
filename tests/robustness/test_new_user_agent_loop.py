"""A streaming agent loop of 66 tool calls on an 8k model, three parallel calls per step.

The client answers each step's calls in reverse order, with results of every shape a tool
returns: a JSON object, an empty string, an array of text parts, long plain text, a JSON array.
Every request the upstream receives must pair calls and results by OpenAI's rules and fit the
window; the client gets every step's three calls whole and the final answer; the ledger holds
every client message exactly once.
"""

from __future__ import annotations

import json

import pytest

from gateway.keys import LEDGER
from policies.rounds import tool_pair_problems
from tests.robustness.scripted import add_call_deltas, answer, client

STEPS = 22
TOOLS = [{"type": "function", "function": {"name": "fetch", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def result(i: int):
    shapes = [
        lambda: json.dumps({"i": i, "rows": [{"k": f"v{i}-{j}", "n": j} for j in range(60)]}),
        lambda: "",
        lambda: [{"type": "text", "text": f"part one of {i} " * 50}, {"type": "text", "text": "part two"}],
        lambda: "plain text result " * 200 + f" ID-{i}",
        lambda: json.dumps([1, 2, 3]),
    ]
    return shapes[i % len(shapes)]()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_long_parallel_tool_loop(scripted, scripted_gateway, stream):
    gw = await scripted_gateway()
    steps = {"n": 0}

    def script(body: dict):
        if body["messages"][-1]["role"] == "tool" and steps["n"] >= STEPS:
            return answer(body, {"content": "done"})
        if body["messages"][-1]["role"] not in ("tool", "user"):
            return answer(body, {"content": "unexpected"})
        steps["n"] += 1
        n = steps["n"]
        calls = [{"id": f"call_{n}_{k}", "type": "function",
                  "function": {"name": "fetch", "arguments": json.dumps({"q": f"item {n} {k}", "pad": "x" * 40})}} for k in range(3)]
        return answer(body, {"content": None, "tool_calls": calls}, finish="tool_calls")

    scripted.script = script
    sdk = client(gw)
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Start the task. Deploy id DEP-42."}]
    for step in range(STEPS + 1):
        raw = await sdk.chat.completions.with_raw_response.create(model="m-8k", messages=messages, tools=TOOLS, stream=stream)
        assert int(raw.headers["x-palimpsest-prompt-tokens-upstream"]) <= 8_000
        if stream:
            content, calls, finish = "", {}, None
            async for event in raw.parse():
                for choice in event.choices:
                    content += choice.delta.content or ""
                    finish = choice.finish_reason or finish
                    add_call_deltas(calls, choice.delta.tool_calls)
            message = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            choice = raw.parse().choices[0]
            message, finish = choice.message.model_dump(exclude_none=True), choice.finish_reason
        messages.append(message)
        if finish != "tool_calls":
            break
        assert [json.loads(c["function"]["arguments"])["q"] for c in message["tool_calls"]] == [f"item {step + 1} {k}" for k in range(3)]
        for k, call in reversed(list(enumerate(message["tool_calls"]))):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result(step * 3 + k)})
    assert (messages[-1]["content"], steps["n"]) == ("done", STEPS)
    for body in scripted.chats():
        assert tool_pair_problems([m for m in body["messages"] if m["role"] not in ("system", "developer")]) == []
    assert any(len(body["messages"]) < len(messages) - 10 for body in scripted.chats()), "the loop was compacted"
    ledger = gw.app[LEDGER]
    (record,) = ledger.sessions()
    events = [e for e in ledger.since(record.key, -1) if e.kind == "message"]
    assert len(events) == len({e.id for e in events}) == len(messages) - 1  # every non-system message once
    assert len(ledger.heads(record.key)) == 1
