"""The client's view of a Responses turn whose upstream calls include recall rounds
(gateway/responses/recall.py over the one stream state machine, gateway/pipeline/stream_filter.py)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from gateway.http.sse import SSEDecoder
from gateway.responses.recall import ResponsesRecallStream
from gateway.responses.stream import visible_output

NAMES = ("session_search", "session_load")


def events(output: list[dict], response_id: str, usage: dict) -> list[dict]:
    out = [{"type": "response.created", "sequence_number": 0, "response": {"id": response_id, "created_at": 1, "output": []}}]
    for index, item in enumerate(output):
        out.append({"type": "response.output_item.added", "sequence_number": 0, "output_index": index, "item": item})
        if item["type"] == "function_call":
            out.append({"type": "response.function_call_arguments.delta", "sequence_number": 0, "output_index": index,
                        "item_id": item["id"], "delta": item["arguments"]})
        out.append({"type": "response.output_item.done", "sequence_number": 0, "output_index": index, "item": item})
    out.append({"type": "response.completed", "sequence_number": 0,
                "response": {"id": response_id, "status": "completed", "output": output, "usage": usage}})
    return out


def told(chunks: list[bytes]) -> list[dict]:
    decoder = SSEDecoder()
    return [orjson.loads(d) for c in chunks for d in decoder.feed(c)]


RS1 = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e1"}
RECALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "session_search", "arguments": '{"query":"x"}'}
RS2 = {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "e2"}
CLIENT = {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "exec_command", "arguments": '{"cmd":"ls"}'}
TEXT = {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}


def run(rounds: list[list[dict]]) -> list[dict]:
    turn = SimpleNamespace(view=SimpleNamespace(recall_names=NAMES), chat=SimpleNamespace(body={}))
    relay, chunks = ResponsesRecallStream(turn), []
    for n, output in enumerate(rounds):
        stream = events(output, f"resp_{n}", {"input_tokens": 10 * (n + 1), "output_tokens": 1, "total_tokens": 10 * (n + 1) + 1})
        for event in stream:
            chunks.append(relay.feed(event))
        final = n == len(rounds) - 1
        chunks.append(relay.end_round(final=final))
        if final:
            chunks.append(relay.finish())
        else:
            relay.new_round()
    return told(chunks)


def test_recall_rounds_never_reach_the_client_and_the_stream_reads_as_one():
    seen = run([[RS1, RECALL], [RS2, CLIENT]])
    kinds = [e["type"] for e in seen]
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
    items = [e["item"]["id"] for e in seen if e["type"] == "response.output_item.added"]
    assert items == ["rs_2", "fc_2"]  # the recall call and the reasoning bound to it are gone
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
    assert [e["output_index"] for e in seen if "output_index" in e] == [0, 0, 1, 1, 1]
    completed = seen[-1]["response"]
    assert completed["id"] == "resp_0"  # the turn keeps the first call's id
    assert [i["id"] for i in completed["output"]] == ["rs_2", "fc_2"]
    assert completed["usage"] == {"input_tokens": 30, "output_tokens": 2, "total_tokens": 32}


def test_a_reasoning_item_stays_with_a_client_call_that_follows_a_recall_call():
    seen = run([[RS1, RECALL, CLIENT]])
    assert [e["item"]["id"] for e in seen if e["type"] == "response.output_item.added"] == ["rs_1", "fc_2"]
    assert visible_output([RS1, RECALL, CLIENT], NAMES) == [RS1, CLIENT]


def test_a_plain_answer_passes_whole():
    seen = run([[RS1, TEXT]])
    assert [i["id"] for i in seen[-1]["response"]["output"]] == ["rs_1", "msg_1"]
    assert visible_output([RS1, RECALL, RS2, TEXT], NAMES) == [RS2, TEXT]
