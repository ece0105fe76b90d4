"""Planned answers (``PuppetState.planned``): a test's model behaviours, rendered by each route
as its provider does, JSON and streamed, read with the official SDKs' types."""

from __future__ import annotations

import anthropic
import openai
import pytest

from simulator.puppet import PUPPET_STATE
from simulator.script import Answer

CUT = Answer(content="partial", calls=[("Bash", '{"command": "l')], stop="length", usage="missing")
REFUSAL = Answer(refusal="I can't help with that.", usage="zero")
THINKING = Answer(content="First,", calls=[("Bash", '{"command": "ls"}')], reasoning="I should list.")
TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


@pytest.fixture
def plan(puppet):
    def arm(*answers: Answer) -> None:
        puppet[0][PUPPET_STATE].planned.extend(answers)
    return arm


async def test_chat_renders_a_cut_answer_a_refusal_and_reasoning(puppet, plan):
    plan(CUT, REFUSAL, THINKING)
    async with openai.AsyncOpenAI(base_url=puppet[1], api_key="k") as client:
        ask = {"model": "fake-32k", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
        cut = await client.chat.completions.create(**ask)
        refused = await client.chat.completions.create(**ask)
        stream = await client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert cut.choices[0].finish_reason == "length" and cut.usage is None
    assert cut.choices[0].message.tool_calls[0].function.arguments == '{"command": "l'
    assert refused.choices[0].message.refusal == "I can't help with that." and refused.choices[0].message.content is None
    assert refused.usage.completion_tokens == 0
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I should list."
    assert "".join(d.content or "" for d in deltas) == "First,"
    assert chunks[-1].usage.completion_tokens > 0


async def test_responses_renders_an_incomplete_response_and_a_refusal(puppet, plan):
    plan(CUT, REFUSAL, REFUSAL)
    async with openai.AsyncOpenAI(base_url=puppet[1], api_key="k") as client:
        cut = await client.responses.create(model="fake-32k", input="hi", store=False)
        refused = await client.responses.create(model="fake-32k", input="hi", store=False)
        events = [e async for e in await client.responses.create(model="fake-32k", input="hi", store=False, stream=True)]
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens" and cut.usage is None
    assert cut.output[-1].status == "incomplete"
    assert refused.output[0].content[0].type == "refusal" and refused.usage.output_tokens == 0
    assert [e.type for e in events if "refusal" in e.type] == ["response.refusal.delta"] * 5 + ["response.refusal.done"]


async def test_messages_renders_max_tokens_a_refusal_and_thinking(puppet, plan):
    plan(CUT, REFUSAL, THINKING)
    async with anthropic.AsyncAnthropic(base_url=puppet[1].removesuffix("/v1"), api_key="k") as client:
        ask = {"model": "fake-32k", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}
        cut = await client.messages.create(**ask)
        refused = await client.messages.create(**ask)
        async with client.messages.stream(**ask, thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
            thought = await stream.get_final_message()
    assert cut.stop_reason == "max_tokens" and cut.content[-1].input == {}
    assert refused.stop_reason == "refusal" and refused.content[0].text == "I can't help with that."
    assert [b.type for b in thought.content] == ["thinking", "text", "tool_use"]
    assert thought.content[0].thinking == "I should list." and thought.content[1].text == "First,"
