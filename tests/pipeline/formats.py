"""One client per wire format, over raw HTTP, for the suites that run a behaviour on all three.

Each ``Wire`` builds a Chat Completions, Responses or Anthropic Messages request from the same
agent-loop script (a task, then tool calls whose results script the next call), reads a JSON
answer or a stream back into the same shape (text, the calls the client sees, output tokens),
and reads an error in its API's envelope. Nothing here knows the gateway: the suites assert on
what the client got and what the upstream (the strict simulator) received.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
import orjson

TOOL_NAME = "Bash"
INSTRUCTIONS = "You are a coding agent. Work in the repository; be terse."


def step_output(step: int, tokens: int = 1800, *, last: bool = False) -> str:
    """A tool result of about `tokens` tokens: a fact to recall later, filler, and (unless it is
    the `last`) the script of the next call."""
    filler = " ".join(f"line{step}-{i} build ok module_{step}_{i}.py passed" for i in range(tokens // 12))
    fact = f"checkpoint-{step}: the artifact for step {step} is at /srv/out/step{step}.bin"
    return f"{fact}\n{filler}" + ("" if last else f"\n[[call {TOOL_NAME} {{\"command\": \"step {step + 1}\"}}]]")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (call id, tool name) the client sees
    output_tokens: int = 0
    body: dict | None = None  # the JSON answer or error envelope
    raw: bytes = b""


class Wire:
    name: str
    path: str

    def headers(self, key: str, session: str | None) -> dict[str, str]:
        out = {"Authorization": f"Bearer {key}"}
        if session is not None:
            out["X-Session-Id"] = session
        return out

    def start(self, text: str) -> list:
        raise NotImplementedError

    def body(self, history: list, *, stream: bool, model: str = "fake-32k") -> dict:
        raise NotImplementedError

    def add_answer(self, history: list, answer: Answer) -> None:
        raise NotImplementedError

    def add_result(self, history: list, call_id: str, text: str) -> None:
        raise NotImplementedError

    def add_user(self, history: list, text: str) -> None:
        raise NotImplementedError

    def read(self, data: dict, answer: Answer) -> None:
        raise NotImplementedError

    def read_stream(self, raw: bytes, answer: Answer) -> None:
        raise NotImplementedError

    def error_type(self, body: dict) -> str:
        """The error's type in this API's envelope (AssertionError when it is another shape)."""
        assert set(body) == {"error"} and isinstance(body["error"], dict), body
        return body["error"]["type"]

    def error_code(self, body: dict) -> str | None:
        return body["error"].get("code")

    def stream_error(self, raw: bytes) -> str | None:
        """The type of the error event a started stream ended with, else None."""
        for event in events(raw):
            if isinstance(event.get("error"), dict):  # chat's and Anthropic's error events
                return event["error"].get("type") or event["error"].get("code")
            if event.get("type") == "error":  # the Responses API's error event
                return event.get("code") or "error"
        return None

    async def post(self, http: aiohttp.ClientSession, base: str, body: dict, *, key: str = "sk-client",
                   session: str | None = None, raw: bytes | None = None) -> Answer:
        data = raw if raw is not None else orjson.dumps(body)
        headers = {"Content-Type": "application/json", **self.headers(key, session)}
        async with http.post(base + self.path, data=data, headers=headers) as resp:
            payload = await resp.read()
            answer = Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, raw=payload)
        if answer.status == 200 and "text/event-stream" in answer.headers.get("content-type", ""):
            self.read_stream(payload, answer)
        else:
            answer.body = orjson.loads(payload) if payload else None
            if answer.status == 200:
                self.read(answer.body, answer)
        return answer


def events(raw: bytes) -> list[dict]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                event = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                out.append(event)
    return out


class Chat(Wire):
    name = "chat"
    path = "/v1/chat/completions"
    tools = [{"type": "function", "function": {"name": TOOL_NAME, "description": "Run a command.",
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]

    def start(self, text: str) -> list:
        return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}]

    def body(self, history, *, stream, model="fake-32k"):
        body = {"model": model, "messages": history, "tools": self.tools, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def add_answer(self, history, answer):
        message = {"role": "assistant", "content": answer.text or None}
        if answer.calls:
            message["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}
                                     for cid, name in answer.calls]
        history.append(message)

    def add_result(self, history, call_id, text):
        history.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def add_user(self, history, text):
        history.append({"role": "user", "content": text})

    def read(self, data, answer):
        message = data["choices"][0]["message"]
        answer.text = message.get("content") or ""
        answer.calls = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls") or ()]
        answer.output_tokens = (data.get("usage") or {}).get("completion_tokens", 0)

    def read_stream(self, raw, answer):
        calls: dict[int, list[str]] = {}
        for event in events(raw):
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                answer.text += delta.get("content") or ""
                for call in delta.get("tool_calls") or ():
                    slot = calls.setdefault(call["index"], ["", ""])
                    slot[0] = call.get("id") or slot[0]
                    slot[1] += (call.get("function") or {}).get("name") or ""
            if event.get("usage"):
                answer.output_tokens += event["usage"].get("completion_tokens", 0)
        answer.calls = [(cid, name) for cid, name in calls.values()]


class Responses(Wire):
    name = "responses"
    path = "/v1/responses"
    tools = [{"type": "function", "name": TOOL_NAME, "description": "Run a command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}, "strict": False}]

    def start(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    def body(self, history, *, stream, model="fake-32k"):
        return {"model": model, "instructions": INSTRUCTIONS, "input": history, "tools": self.tools,
                "stream": stream, "store": False}

    def add_answer(self, history, answer):
        for item in (answer.body or {}).get("output") or ():
            history.append({k: v for k, v in item.items() if k not in ("id", "status")})

    def add_result(self, history, call_id, text):
        history.append({"type": "function_call_output", "call_id": call_id, "output": text})

    def add_user(self, history, text):
        history.append({"role": "user", "content": text})

    def read(self, data, answer):
        answer.body = data
        for item in data.get("output") or ():
            if item.get("type") == "message":
                answer.text += "".join(p.get("text", "") for p in item.get("content") or () if isinstance(p, dict))
            elif item.get("type") == "function_call":
                answer.calls.append((item["call_id"], item["name"]))
        answer.output_tokens = (data.get("usage") or {}).get("output_tokens", 0)

    def read_stream(self, raw, answer):
        done = [e for e in events(raw) if e.get("type") == "response.completed"]
        if done:
            self.read(done[-1]["response"], answer)


class Messages(Wire):
    name = "messages"
    path = "/v1/messages"
    tools = [{"name": TOOL_NAME, "description": "Run a command.",
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]

    def headers(self, key, session):
        out = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        if session is not None:
            out["X-Session-Id"] = session
        return out

    def start(self, text: str) -> list:
        return [{"role": "user", "content": text}]

    def body(self, history, *, stream, model="fake-32k"):
        return {"model": model, "max_tokens": 2048, "system": INSTRUCTIONS, "messages": history, "tools": self.tools,
                "stream": stream}

    def add_answer(self, history, answer):
        blocks = ([{"type": "text", "text": answer.text}] if answer.text else []) + [
            {"type": "tool_use", "id": cid, "name": name, "input": {}} for cid, name in answer.calls]
        history.append({"role": "assistant", "content": blocks})

    def add_result(self, history, call_id, text):
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]})

    def add_user(self, history, text):
        if history and history[-1]["role"] == "user":
            history[-1]["content"] = [*history[-1]["content"], {"type": "text", "text": text}]
        else:
            history.append({"role": "user", "content": text})

    def read(self, data, answer):
        for block in data.get("content") or ():
            if block.get("type") == "text":
                answer.text += block["text"]
            elif block.get("type") == "tool_use":
                answer.calls.append((block["id"], block["name"]))
        answer.output_tokens = (data.get("usage") or {}).get("output_tokens", 0)

    def read_stream(self, raw, answer):
        for event in events(raw):
            kind = event.get("type")
            if kind == "content_block_start" and event["content_block"].get("type") == "tool_use":
                answer.calls.append((event["content_block"]["id"], event["content_block"]["name"]))
            elif kind == "content_block_delta" and event["delta"].get("type") == "text_delta":
                answer.text += event["delta"]["text"]
            elif kind == "message_delta":
                answer.output_tokens = (event.get("usage") or {}).get("output_tokens", answer.output_tokens)

    def error_type(self, body):
        assert body.get("type") == "error" and isinstance(body.get("error"), dict), body
        return body["error"]["type"]

    def error_code(self, body):
        return body["error"].get("type")


WIRES = {w.name: w for w in (Chat(), Responses(), Messages())}


def main_requests(upstream, wire: Wire) -> list[dict]:
    """What the upstream received on the format's own route, summary calls left out."""
    return [r["json"] for r in upstream.received
            if r["path"].split("?")[0] == wire.path and r.get("json")
            and r["headers"].get("x-palimpsest-purpose") != "summary"]


async def run_loop(wire: Wire, http: aiohttp.ClientSession, base: str, session: str, steps: int, *,
                   key: str = "sk-client", tokens: int = 1800, model: str = "fake-32k") -> tuple[list, list[Answer]]:
    """An agent loop of `steps` tool calls: each answer must call the tool, each result scripts
    the next call, but the last one's, which ends the chain. Returns the history as the client
    keeps it and every answer."""
    history = wire.start(f"Run the chain. [[call {TOOL_NAME} {{\"command\": \"step 1\"}}]]")
    answers = []
    for step in range(1, steps + 1):
        answer = await wire.post(http, base, wire.body(history, stream=False, model=model), key=key, session=session)
        assert answer.status == 200 and answer.calls, (step, answer.status, answer.body)
        answers.append(answer)
        wire.add_answer(history, answer)
        wire.add_result(history, answer.calls[0][0], step_output(step, tokens, last=step == steps))
    return history, answers


async def ask_back(wire: Wire, http: aiohttp.ClientSession, base: str, session: str, outputs, question: str, *,
                   upstream, settle) -> tuple[Answer, list[dict]]:
    """A chain whose tool results are ``outputs`` (each scripts the next call but the last), the
    model's closing answer, then the user's ``question``: the answer to it and what the upstream
    received for it (the recall rounds included). ``settle()`` is awaited before the question
    (the suite's wait for the gateway's summary jobs)."""
    history = wire.start(f"Run the chain. [[call {TOOL_NAME} {{\"command\": \"step 1\"}}]]")
    for step, text in enumerate(outputs, 1):
        answer = await wire.post(http, base, wire.body(history, stream=False), session=session)
        assert answer.status == 200 and answer.calls, (step, answer.body)
        wire.add_answer(history, answer)
        wire.add_result(history, answer.calls[0][0], text)
    reply = await wire.post(http, base, wire.body(history, stream=False), session=session)
    wire.add_answer(history, reply)
    await settle()
    wire.add_user(history, question)
    before = len(main_requests(upstream, wire))
    answer = await wire.post(http, base, wire.body(history, stream=False), session=session)
    return answer, main_requests(upstream, wire)[before:]
