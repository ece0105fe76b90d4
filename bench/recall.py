"""Recall: does an exact old fact come back through session_search / session_load?

    .venv/bin/python bench/recall.py --quick              # a handful of cases, < 3 minutes
    .venv/bin/python bench/recall.py                      # full run, < 15 minutes on 2 CPUs
    .venv/bin/python bench/recall.py --cases 20 --stream-cases 5 --seeds 1,2 --json out.json

Everything talks to the SIMULATED upstream (gateway/puppet.py), in one process (bench/common.py).
The puppet's script for ``RECALL: question`` is fixed: it calls session_search(question), then
session_load on the TOP hit only, and answers ``ANSWER: <loaded content>`` (first 2,000 chars).

(a) LongMemEval-S: each case as ONE request to ``fake-32k``: system prompt + the whole haystack
    (~500 turns, ~100k tokens) + ``RECALL: <question>``, non-streaming; a subset again streaming
    (fresh sessions). A subset also runs "after catch-up": the haystack arrives with a plain
    message, the background summary and index catch up, then ``RECALL: <question>`` follows.
    Evidence = a turn marked has_answer. Per question: was the loaded event an evidence turn;
    was evidence already in the prompt the model got; answer-word recall (share of the gold
    answer's words in the ANSWER text); prompt tokens of the turn's upstream requests vs the full
    context; searches and loads; errors. hit@k of the gateway's own search (whole session, no
    exclusions) shows what a model reading more than the top hit could find. "Reaches the
    model" (bench/reach.py): the answer round's request (view + recall results) holds an
    evidence turn whole, or a piece of it holding the turn's gold-answer words; the direct
    column applies the same test to the request sent direct (0 when it does not fit).
(b) Synthetic agent sessions (simulator.workloads) with planted facts: ~60 rounds through the
    gateway, then each fact asked with ``RECALL: <question>``, ``RECALL: <paraphrase>`` (the
    workload's hand-written one) and ``RECALL: <reworded>`` (bench/paraphrase.py: the question with
    every word it shares with the fact replaced by a fixed rule), each a separate request
    continuing the same history. Evidence recall = ANSWER contains fact.answer.
(c) Search latency: ``RecallTools.run`` (the session_search tool as the recall loop runs it) on a
    ~500-event LongMemEval session, p50/p99 over many queries; plus the in-turn tool times.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402

import billing  # noqa: E402
from common import (  # noqa: E402
    MODEL, Bench, Client, answer_text, count_prompt, flatten_haystack, fmt, load_cases,
    machine_note, percentile, quiet_logs, replay, run_and_report,
)
from gateway.keys import INDEXER, LEDGER, PIPELINE, SUMMARIZER  # noqa: E402
from simulator.workloads import TOOL_SPECS, synthetic_session  # noqa: E402
from store.canonical import path_ids  # noqa: E402
from paraphrase import reworded  # noqa: E402
from reach import reaching  # noqa: E402
from ranking import split_of  # noqa: E402
from store.chunking import query_terms  # noqa: E402

AUTO_BLOCK = "<recalled_history>"

PURPOSE = "x-palimpsest-purpose"
SEARCH, LOAD = "session_search", "session_load"


# --- helpers -------------------------------------------------------------------------------------


def turn_requests(bench: Bench, start: int) -> list[dict]:
    """Bodies of the forwarded (non-summary) chat requests the puppet received since `start`."""
    return [r["json"] for r in bench.puppet.received[start:]
            if r["path"].endswith("/chat/completions") and r.get("json")
            and r["headers"].get(PURPOSE, "") != "summary"]


def recall_trace(bodies: list[dict]) -> dict:
    """What the recall loop did in one turn, read from the last upstream request of the turn:
    the gateway appends each recall call and its result to the view."""
    if not bodies:
        return {"searches": 0, "loads": 0, "loaded": [], "search_results": [], "tool_errors": 0,
                "from_passage": False, "with_passage": set(), "passage_texts": []}
    last = bodies[-1]["messages"]
    names: dict[str, str] = {}
    searches = loads = tool_errors = 0
    loaded: list[str] = []
    passages: list[str] = []
    with_passage: set[str] = set()
    search_results: list[list[str]] = []
    passage_texts: list[str] = []  # every passage of every search result, best hit first
    for m in last:
        for call in m.get("tool_calls") or ():
            name = call["function"]["name"]
            if SEARCH in name:
                searches += 1
                names[call["id"]] = "search"
            elif LOAD in name:
                loads += 1
                names[call["id"]] = "load"
                try:
                    loaded.append(orjson.loads(call["function"]["arguments"]).get("event_id"))
                except (orjson.JSONDecodeError, AttributeError):
                    pass
        if m.get("role") == "tool" and m.get("tool_call_id") in names:
            try:
                result = orjson.loads(m["content"])
            except orjson.JSONDecodeError:
                tool_errors += 1
                continue
            if "error" in result:
                tool_errors += 1
            elif names[m["tool_call_id"]] == "search":
                search_results.append([h["event_id"] for h in result.get("results", ())])
                top = (result.get("results") or [{}])[0]
                if top.get("passage"):
                    passages.append(top["event_id"])
                with_passage.update(h["event_id"] for h in result.get("results", ()) if h.get("passage"))
                passage_texts += [str(h["passage"]) for h in result.get("results", ()) if h.get("passage")]
    # A model that answered from the top hit's passage read that event without loading it.
    read = loaded if loads else passages[-1:]
    return {"searches": searches, "loads": loads, "loaded": read, "search_results": search_results,
            "tool_errors": tool_errors, "from_passage": not loads and bool(passages),
            "with_passage": with_passage, "passage_texts": passage_texts}


def words(text: str) -> list[str]:
    terms = query_terms(str(text))
    return terms or [w for w in str(text).lower().split() if w]


def word_recall(gold: str, text: str) -> float:
    gold_words = words(gold)
    have = set(words(text))
    return sum(w in have for w in gold_words) / len(gold_words) if gold_words else float("nan")


def evidence_ids(bench: Bench, key: str, evidence: list[str], ids: list[str]) -> dict[str, str]:
    """Event ids (on this path) whose content is an evidence turn's text, with that text."""
    ledger = bench.gateway.app[LEDGER]
    wanted = set(evidence)
    out = {}
    for event in ledger.get_many(key, ids):
        if event.message.get("content") in wanted:
            out[event.id] = event.message["content"]
    return out


def in_view(view_messages: list[dict], needles: list[str]) -> bool:
    """Any needle verbatim inside the view's first upstream request (system block included)."""
    texts = [m.get("content") for m in view_messages if isinstance(m.get("content"), str)]
    return any(n and any(n in t for t in texts) for n in needles)


# --- (a) LongMemEval -------------------------------------------------------------------------------


async def lme_case(bench: Bench, client: Client, case: dict, *, stream: bool, steady: bool,
                   arrival_prior: float | None) -> dict:
    messages, evidence = flatten_haystack(case)
    full_body = {"model": MODEL, "messages": messages + [{"role": "user", "content": f"RECALL: {case['question']}"}]}
    full_tokens = count_prompt(full_body)
    sid = f"lme-{'steady' if steady else 'stream' if stream else 'json'}-{case['question_id']}"
    bench.puppet.reset()
    catch_up = 0.0
    client_requests: list[tuple[dict, dict | None]] = []  # for the ideal-direct bill
    earlier_calls: list = []
    if steady:
        first_body = {"model": MODEL, "messages": messages + [
            {"role": "user", "content": "Thanks for all of this. Let's continue later."}]}
        first = await client.chat(first_body, sid)
        client_requests.append((first_body, first.message))
        messages = messages + [{"role": "user", "content": "Thanks for all of this. Let's continue later."},
                               first.message or {"role": "assistant", "content": "ok"}]
        catch_up = await bench.gateway.settle()
        earlier_calls = list(bench.puppet.calls)
        bench.puppet.reset(cache=False)  # the same session goes on: the provider's cache stays
    body = {"model": MODEL, "messages": messages + [{"role": "user", "content": f"RECALL: {case['question']}"}]}
    if not steady and arrival_prior:
        # The sync path folds a big delta only if (chunks x learnt seconds per summary call)
        # fits sync_budget_s. The puppet answers summaries instantly, so after one job the
        # gateway would fold 100k tokens on the request path; reset the estimate to the
        # gateway's own prior so arrivals are handled as with a provider whose summary calls
        # take seconds (tailored now, summary in the background).
        bench.gateway.app[SUMMARIZER]._call_seconds = arrival_prior
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    start = len(bench.puppet.received)
    reply = await client.chat(body, sid)
    bodies = turn_requests(bench, start)
    client_requests.append((body, reply.message))
    await bench.gateway.settle()  # the background summary is part of the bill
    bill = billing.billed([*earlier_calls, *bench.puppet.calls])
    ideal = billing.ideal_direct(client_requests)
    trace = recall_trace(bodies)
    key = bench.gateway.session_key(sid)
    ids = path_ids([m for m in body["messages"] if m["role"] not in ("system", "developer")])
    ev_ids = evidence_ids(bench, key, evidence, ids) if key else {}
    # Evidence reaching the model in the answer round (bench/reach.py), and the same test on
    # the request sent direct: all of it when it fits the window, nothing when it is rejected.
    answer_round = bodies[-1]["messages"] if bodies else []
    reached = reaching(answer_round, ev_ids, str(case["answer"]))
    unnamed = {f"direct-{i}": t for i, t in enumerate(dict.fromkeys(evidence))}
    direct_all = reaching(full_body["messages"], unnamed, str(case["answer"]))
    direct = direct_all if full_tokens <= 32_000 else set()
    answer = answer_text(reply)
    loaded_ev = any(e in ev_ids for e in trace["loaded"])
    view = bodies[0]["messages"] if bodies else []
    visible = in_view(view, evidence)
    block = next((m["content"] for m in view if isinstance(m.get("content"), str)
                  and m["content"].startswith(AUTO_BLOCK)), "")
    auto_ev = any(e in ev_ids for e in re.findall(r"\"event_id\": \"(ev_\w+)\"", block))
    # The gateway's own search over the whole session (no exclusions), as a model reading more
    # than the top hit would see it.
    # Only haystack turns count: the RECALL message itself (which matches the question best)
    # and the answers recorded after it are dropped from the ranking.
    ranks = None
    if key:
        haystack = set(ids[:-1])
        hits = await (await bench.gateway.app[INDEXER].opened()).search(key, case["question"], limit=14)
        hits = [h for h in hits if h.event_id in haystack][:10]
        ranks = next((i + 1 for i, h in enumerate(hits) if h.event_id in ev_ids), None)
    hidden_top5 = any(e in ev_ids for res in trace["search_results"] for e in res[:5])
    leaks = 0
    if stream:
        for chunk in reply.chunks:
            for choice in chunk.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    if SEARCH in ((call.get("function") or {}).get("name") or "") or \
                       LOAD in ((call.get("function") or {}).get("name") or ""):
                        leaks += 1
        ids_seen = {c.get("id") for c in reply.chunks if c.get("id")}
        leaks += max(0, len(ids_seen) - 1)
    up_tokens = [count_prompt(b) for b in bodies]
    # Diagnostics: where the evidence sits in the haystack, and the oldest haystack turn the
    # view still shows verbatim.
    contents = [m.get("content") for m in body["messages"]]
    ev_pos = [i for i, c in enumerate(contents) if c in set(evidence)]
    view_texts = {m.get("content") for m in view if isinstance(m.get("content"), str)}
    oldest = next((i for i, c in enumerate(contents) if i > 0 and c in view_texts), None)
    calls = [c for c in bench.puppet.calls if c.index >= start and c.purpose != "summary"]
    error = reply.error or ("" if reply.status == 200 else f"HTTP {reply.status}")
    if not error and not (reply.message or {}).get("content", "").startswith("ANSWER:"):
        error = "no ANSWER"
    return {
        "case": case["question_id"], "type": case.get("question_type"),
        "mode": "steady" if steady else "stream" if stream else "json",
        "status": reply.status, "error": error, "elapsed_s": reply.elapsed, "catch_up_s": catch_up,
        "full_tokens": full_tokens, "turn_tokens": sum(up_tokens),
        "answer_tokens": up_tokens[-1] if up_tokens else 0, "upstream_requests": len(bodies),
        "searches": trace["searches"], "loads": trace["loads"], "tool_errors": trace["tool_errors"],
        "loaded_evidence": loaded_ev, "evidence_in_view": visible,
        "evidence_available": loaded_ev or visible or auto_ev,
        "auto_block": bool(block), "auto_evidence": auto_ev, "direct_fits": full_tokens <= 32_000,
        "passage_evidence": bool(trace["with_passage"] & set(ev_ids)),
        "reaches": bool(reached), "reaches_all": bool(evidence) and reached >= set(evidence),
        "direct_reaches": bool(direct), "direct_reaches_all": bool(evidence) and direct >= set(evidence),
        "unlimited_reaches": bool(direct_all),
        # The gold answer's words in the text the search result put before the model: its top
        # passage (what the puppet answers from) and all its passages (what a model reads).
        "top_passage_words": word_recall(str(case["answer"]), trace["passage_texts"][0]) if trace["passage_texts"] else 0.0,
        "result_words": word_recall(str(case["answer"]), " ".join(trace["passage_texts"])),
        "auto_word_recall": word_recall(str(case["answer"]), block) if block else 0.0,
        "from_passage": trace["from_passage"], "split": split_of(case["question_id"]),
        "answer_in_evidence": bool(answer) and any(answer[:300] in e for e in evidence),
        "answer_word_recall": word_recall(str(case["answer"]), answer),
        "gold_in_view_word_recall": word_recall(str(case["answer"]), " ".join(
            m.get("content") or "" for m in bodies[-1]["messages"] if isinstance(m.get("content"), str)))
        if bodies else float("nan"),
        "search_rank": ranks, "hidden_scope_top5": hidden_top5, "stream_leaks": leaks,
        "evidence_events": len(ev_ids),
        "header_recall_calls": int(reply.headers.get("x-palimpsest-recall-calls", 0) or 0),
        "checkpoint_used": bool(reply.headers.get("x-palimpsest-checkpoint")),
        "evidence_at": ev_pos, "view_oldest_turn": oldest, "turns": len(contents),
        "over_window": sum(t + (b.get("max_tokens") or 0) > 32_000 for t, b in zip(up_tokens, bodies)),
        "rejected": sum(c.status != 200 for c in calls),
        "rejections": [c.status for c in calls if c.status != 200],
        "bill": bill, "ideal": ideal,
    }


def lme_summary(rows: list[dict]) -> dict:
    if not rows:
        return {}
    n = len(rows)
    mean = lambda k: sum(float(r[k]) for r in rows if r[k] == r[k]) / max(1, sum(1 for r in rows if r[k] == r[k]))  # noqa: E731
    ranked = [r["search_rank"] for r in rows]
    return {
        "mode": rows[0]["mode"], "n": n,
        "errors": sum(bool(r["error"]) for r in rows) + sum(r["tool_errors"] for r in rows),
        "loaded_evidence": mean("loaded_evidence"), "evidence_in_view": mean("evidence_in_view"),
        "evidence_available": mean("evidence_available"),
        "answer_word_recall": mean("answer_word_recall"),
        "turn_share": sum(r["turn_tokens"] for r in rows) / sum(r["full_tokens"] for r in rows),
        "answer_share": sum(r["answer_tokens"] for r in rows) / sum(r["full_tokens"] for r in rows),
        "full_tokens_mean": mean("full_tokens"), "turn_tokens_mean": mean("turn_tokens"),
        "answer_tokens_mean": mean("answer_tokens"),
        "searches": mean("searches"), "loads": mean("loads"),
        "hit1": sum(1 for r in ranked if r is not None and r <= 1) / n,
        "hit5": sum(1 for r in ranked if r is not None and r <= 5) / n,
        "hit10": sum(1 for r in ranked if r is not None and r <= 10) / n,
        "hidden_top5": mean("hidden_scope_top5"),
        "auto_block": mean("auto_block"), "auto_evidence": mean("auto_evidence"),
        "direct_fits": mean("direct_fits"), "passage_evidence": mean("passage_evidence"),
        "reaches": mean("reaches"), "reaches_all": mean("reaches_all"),
        "direct_reaches": mean("direct_reaches"), "direct_reaches_all": mean("direct_reaches_all"),
        "unlimited_reaches": mean("unlimited_reaches"),
        "auto_word_recall": mean("auto_word_recall"), "from_passage": mean("from_passage"),
        "top_passage_words": mean("top_passage_words"), "result_words": mean("result_words"),
        "result_words_full": sum(r["result_words"] >= 1.0 for r in rows) / n,
        "top_passage_words_full": sum(r["top_passage_words"] >= 1.0 for r in rows) / n,
        "by_split": {split: {"n": len(part),
                             "loaded_evidence": sum(r["loaded_evidence"] for r in part) / len(part),
                             "evidence_available": sum(r["evidence_available"] for r in part) / len(part),
                             "reaches": sum(r["reaches"] for r in part) / len(part)}
                     for split in ("tune", "held-out")
                     if (part := [r for r in rows if r["split"] == split])},
        "latency_p50_s": percentile([r["elapsed_s"] for r in rows], 50),
        "latency_max_s": max(r["elapsed_s"] for r in rows),
        "stream_leaks": sum(r["stream_leaks"] for r in rows),
        "checkpoint_used": mean("checkpoint_used"),
        "over_window": sum(r["over_window"] for r in rows), "rejected": sum(r["rejected"] for r in rows),
        "billed_over_ideal": sum(r["bill"]["cost"] for r in rows) / sum(r["ideal"]["cost"] for r in rows),
        "all_over_client": (sum(r["bill"]["prompt"] + r["bill"]["output"] for r in rows)
                            / sum(r["ideal"]["prompt"] for r in rows)),
    }


async def longmemeval(args, cases: list[dict], tool_times: dict) -> tuple[list[dict], Bench]:
    bench = await Bench.start(recall=args.recall_settings, **args.policy_settings)
    wrap_tools(bench, tool_times)
    client = Client(bench.gateway.base_url)
    rows = []
    try:
        for i, case in enumerate(cases):
            rows.append(await lme_case(bench, client, case, stream=False, steady=False, arrival_prior=args.arrival_prior))
            if i < args.stream_cases:
                rows.append(await lme_case(bench, client, case, stream=True, steady=False, arrival_prior=args.arrival_prior))
            if i < args.steady_cases:
                rows.append(await lme_case(bench, client, case, stream=False, steady=True, arrival_prior=args.arrival_prior))
            await bench.gateway.settle()
            if args.verbose:
                print(f"  {case['question_id']}: " + ", ".join(
                    f"{r['mode']} loaded={r['loaded_evidence']} reaches={r['reaches']} view={r['evidence_in_view']} "
                    f"rank={r['search_rank']} words={r['answer_word_recall']:.2f} {r['error']}"
                    for r in rows if r["case"] == case["question_id"]), file=sys.stderr, flush=True)
    finally:
        await client.close()
    return rows, bench


def wrap_tools(bench: Bench, tool_times: dict[str, list[float]]) -> None:
    """Time every recall tool execution of the recall loop (index catch-up included)."""
    tools = bench.gateway.app[PIPELINE].loop.tools
    original = tools.run

    async def timed(call, *, kind, **kw):
        started = time.perf_counter()
        try:
            return await original(call, kind=kind, **kw)
        finally:
            tool_times.setdefault(kind, []).append(time.perf_counter() - started)

    tools.run = timed


# --- (b) planted facts ----------------------------------------------------------------------------


async def planted(args, tool_times: dict) -> list[dict]:
    bench = await Bench.start(recall=args.recall_settings, **args.policy_settings)
    wrap_tools(bench, tool_times)
    client = Client(bench.gateway.base_url)
    rows = []
    try:
        for seed in args.seed_list:
            session = synthetic_session(seed, rounds=args.rounds)
            sid = f"facts-{seed}"
            history, sent = await replay(client, session, sid)
            await bench.gateway.settle()
            key = bench.gateway.session_key(sid)
            ledger = bench.gateway.app[LEDGER]
            for fact in session.facts:
                for phrasing, question in (("question", fact.question), ("paraphrase", fact.paraphrase),
                                           ("reworded", reworded(fact.question, fact.statement))):
                    bench.puppet.reset()
                    body = {"model": MODEL, "tools": TOOL_SPECS,
                            "messages": history + [{"role": "user", "content": f"RECALL: {question}"}]}
                    start = len(bench.puppet.received)
                    reply = await client.chat(body, sid)
                    bodies = turn_requests(bench, start)
                    trace = recall_trace(bodies)
                    answer = answer_text(reply)
                    loaded_text = " ".join(
                        (ledger.get(key, e).message.get("content") or "") if ledger.get(key, e) else ""
                        for e in trace["loaded"] if e)
                    view = bodies[0]["messages"] if bodies else []
                    where = "user" if fact.round % 4 == 2 else "tool"
                    error = reply.error or ("" if reply.status == 200 else f"HTTP {reply.status}")
                    if not error and not (reply.message or {}).get("content", "").startswith("ANSWER:"):
                        error = "no ANSWER"
                    path = set(path_ids([m for m in history if m["role"] != "system"]))
                    # Ranked within the history's path: the session also holds the earlier asks
                    # (other branches), whose scores would set the legs' scale (issue 28: an
                    # earlier ask made the reworded question's fact look ranked first while the
                    # model's own search, on the path, had it at rank None).
                    hits = await (await bench.gateway.app[INDEXER].opened()).search(
                        key, question, limit=10, within=frozenset(path))
                    rank = next((i + 1 for i, h in enumerate(hits) if ledger.get(key, h.event_id)
                                 and fact.answer in (ledger.get(key, h.event_id).message.get("content") or "")), None)
                    calls = [c for c in bench.puppet.calls if c.index >= start and c.purpose != "summary"]
                    rows.append({
                        "over_window": sum(count_prompt(b) + (b.get("max_tokens") or 0) > 32_000 for b in bodies),
                        "rejected": sum(c.status != 200 for c in calls),
                        "search_rank": rank,
                        "seed": seed, "fact": fact.answer, "phrasing": phrasing, "planted_in": where,
                        "split": split_of(fact.statement),  # bench/ranking.py's split of the agent facts
                        "round": fact.round, "status": reply.status, "error": error,
                        "recalled": fact.answer in answer,
                        "loaded_fact_event": fact.answer in loaded_text,
                        "value_in_view": in_view(view, [fact.answer]),
                        "raw_in_view": in_view(view[1:], [fact.statement]),
                        "searches": trace["searches"], "loads": trace["loads"],
                        "tool_errors": trace["tool_errors"],
                        "turn_tokens": sum(count_prompt(b) for b in bodies),
                        "client_tokens": count_prompt(body),
                        "direct_fits": count_prompt(body) <= 32_000,
                        "elapsed_s": reply.elapsed,
                    })
            await bench.gateway.settle()
            if args.verbose:
                got = [r for r in rows if r["seed"] == seed]
                print(f"  seed {seed}: recalled {sum(r['recalled'] for r in got)}/{len(got)}",
                      file=sys.stderr, flush=True)
    finally:
        await client.close()
        await bench.stop()
    return rows


def facts_summary(rows: list[dict]) -> dict:
    n = len(rows) or 1
    by = lambda cond: [r for r in rows if cond(r)]  # noqa: E731
    rate = lambda rs, k: sum(r[k] for r in rs) / len(rs) if rs else float("nan")  # noqa: E731
    return {
        "n": len(rows), "recalled": rate(rows, "recalled"), "direct_fits": rate(rows, "direct_fits"),
        "available": sum(r["recalled"] or r["raw_in_view"] for r in rows) / n,
        "recalled_question": rate(by(lambda r: r["phrasing"] == "question"), "recalled"),
        "recalled_paraphrase": rate(by(lambda r: r["phrasing"] == "paraphrase"), "recalled"),
        "recalled_reworded": rate(by(lambda r: r["phrasing"] == "reworded"), "recalled"),
        "recalled_paraphrased": rate(by(lambda r: r["phrasing"] != "question"), "recalled"),
        "recalled_user": rate(by(lambda r: r["planted_in"] == "user"), "recalled"),
        "recalled_tool": rate(by(lambda r: r["planted_in"] == "tool"), "recalled"),
        "loaded_fact_event": rate(rows, "loaded_fact_event"),
        "value_in_view": rate(rows, "value_in_view"), "raw_in_view": rate(rows, "raw_in_view"),
        "errors": sum(bool(r["error"]) for r in rows) + sum(r["tool_errors"] for r in rows),
        "over_window": sum(r["over_window"] for r in rows), "rejected": sum(r["rejected"] for r in rows),
        "searches": sum(r["searches"] for r in rows) / n, "loads": sum(r["loads"] for r in rows) / n,
        "turn_share": sum(r["turn_tokens"] for r in rows) / max(1, sum(r["client_tokens"] for r in rows)),
        "latency_p50_s": percentile([r["elapsed_s"] for r in rows], 50),
        "misses": [f"{r['fact']}({r['phrasing']},{r['planted_in']},rank {r['search_rank']})"
                   for r in rows if not r["recalled"]],
        # Per tune / held-out split (bench/ranking.py tunes on "tune"): recalled, question, paraphrase.
        "by_split": {s: {k: rate(by(lambda r: r.get("split") == s and (p is None or r["phrasing"] == p)), "recalled")
                         for k, p in (("recalled", None), ("question", "question"), ("paraphrase", "paraphrase"))}
                     for s in ("tune", "held-out")},
        "hit1": sum(1 for r in rows if r["search_rank"] and r["search_rank"] <= 1) / n,
        "hit5": sum(1 for r in rows if r["search_rank"] and r["search_rank"] <= 5) / n,
    }


# --- (c) search latency ---------------------------------------------------------------------------


async def search_latency(args, bench: Bench, cases: list[dict]) -> dict:
    """session_search as the recall loop runs it (RecallTools.run: index catch-up check, hybrid
    search, result JSON), on the ~500-event session of the first case, warm."""
    app = bench.gateway.app
    tools = app[PIPELINE].loop.tools
    case = cases[0]
    sid = f"lme-json-{case['question_id']}"
    key = bench.gateway.session_key(sid)
    messages, _ = flatten_haystack(case)
    history = [m for m in messages if m["role"] != "system"]
    ids = path_ids(history + [{"role": "user", "content": f"RECALL: {case['question']}"}])
    events = app[LEDGER].session(key).events if hasattr(app[LEDGER], "session") else len(ids)
    # What an arrival hides: tailoring keeps roughly the newest 30% of the turns in view, and
    # the default 'hidden' scope excludes those (~150 ids) from the search.
    hidden = frozenset(ids[: int(len(ids) * 0.7)])
    queries = [c["question"] for c in cases] + [f.question for f in _fact_queries()] + \
              [f.paraphrase for f in _fact_queries()]
    while len(queries) < args.queries:
        queries += queries
    queries = queries[: args.queries]
    run = tools.run
    times = {"hidden scope": [], "whole session": []}
    for q in queries[:10]:  # warm-up
        await run({"id": "w", "type": "function", "function": {"name": SEARCH, "arguments": orjson.dumps({"query": q}).decode()}},
                  kind="search", session_key=key, path_ids=ids, hidden=hidden)
    for q in queries:
        for label, scope in (("hidden scope", None), ("whole session", "session")):
            arguments = {"query": q} if scope is None else {"query": q, "scope": scope}
            call = {"id": "b", "type": "function", "function": {"name": SEARCH, "arguments": orjson.dumps(arguments).decode()}}
            started = time.perf_counter()
            await run(call, kind="search", session_key=key, path_ids=ids, hidden=hidden)
            times[label].append(time.perf_counter() - started)
    return {"events": events, "queries": len(queries), "excluded": len(ids) - len(hidden),
            **{f"{label}_p50_ms": percentile(v, 50) * 1e3 for label, v in times.items()},
            **{f"{label}_p99_ms": percentile(v, 99) * 1e3 for label, v in times.items()}}


def _fact_queries():
    return synthetic_session(0, rounds=14).facts


# --- output ---------------------------------------------------------------------------------------


def render(result: dict) -> str:
    lines = []
    lme = result.get("longmemeval", [])
    if lme:
        head = (f"{'LongMemEval':<16} {'n':>3} {'err':>3} {'loaded ev':>9} {'ev in view':>10} "
                f"{'ev avail':>8} {'ans words':>9} {'turn/full':>9} {'ans/full':>8} {'full tok':>8} "
                f"{'turn tok':>8} {'srch':>4} {'load':>4} {'hit@1':>5} {'hit@5':>5} {'hit@10':>6} "
                f"{'cp':>4} {'>win':>4} {'rej':>3} {'p50 s':>6} {'max s':>6} {'bill/ideal':>10} {'all/cl':>6}")
        lines += [f"(a) LongMemEval-S on {MODEL}: one ~100k-token request ending with RECALL: <question>",
                  head, "-" * len(head)]
        labels = {"json": "arrival", "stream": "arrival stream", "steady": "after catch-up"}
        for s in lme:
            lines.append(
                f"{labels.get(s['mode'], s['mode']):<16} {s['n']:>3} {s['errors']:>3} "
                f"{fmt(s['loaded_evidence'], 3):>9} {fmt(s['evidence_in_view'], 3):>10} "
                f"{fmt(s['evidence_available'], 3):>8} {fmt(s['answer_word_recall'], 3):>9} "
                f"{fmt(s['turn_share'], 3):>9} {fmt(s['answer_share'], 3):>8} "
                f"{fmt(s['full_tokens_mean'], 0):>8} {fmt(s['turn_tokens_mean'], 0):>8} "
                f"{fmt(s['searches'], 2):>4} {fmt(s['loads'], 2):>4} {fmt(s['hit1'], 2):>5} "
                f"{fmt(s['hit5'], 2):>5} {fmt(s['hit10'], 2):>6} {fmt(s['checkpoint_used'], 2):>4} "
                f"{s['over_window']:>4} {s['rejected']:>3} "
                f"{fmt(s['latency_p50_s'], 2):>6} "
                f"{fmt(s['latency_max_s'], 2):>6} {fmt(s['billed_over_ideal'], 3):>10} "
                f"{fmt(s['all_over_client'], 3):>6}")
        lines += [
            "loaded ev: the event session_load returned (top search hit) is a has_answer turn; ev in "
            "view: a has_answer turn is verbatim in the prompt the gateway sent (tailoring kept it, so "
            "the default 'hidden' search scope excludes it); ev avail: either;",
            "ans words: share of the gold answer's words in the ANSWER text; turn/full: prompt tokens "
            "of all upstream requests of the turn (3: search, load, answer) / the full context; "
            "ans/full: the final answering request alone;",
            "hit@k: an evidence turn in the top k of the gateway's own search over the whole session "
            "(no exclusions), what a model reading more than the top hit could find; cp: share of "
            "answers whose view used a summary checkpoint (x-palimpsest-checkpoint); >win / rej: "
            "upstream requests of the turns over the 32k window / rejected by the provider; err: "
            "client-visible errors (non-200, no ANSWER) + recall tool errors.",
            "arrival: the haystack and the question in one request (tailored view + structured state "
            "+ recall tools; the summary catches up afterwards); after catch-up: the haystack arrived "
            "with a plain message first, the summary and index caught up, then the question came.",
            "bill/ideal: billed cost of every upstream call of the case (recall rounds and summary "
            "calls included; uncached + 0.1 x cached input + output) / the client's own requests "
            "through a perfect cache with no window (bench/billing.py); all/cl: all upstream "
            "prompt+completion tokens / the client's prompt tokens.",
        ]
        if any(s["mode"] == "stream" for s in lme):
            s = next(s for s in lme if s["mode"] == "stream")
            lines.append(f"streaming: {s['stream_leaks']} recall tool-call deltas or foreign ids reached the client")
    if (f := result.get("facts")):
        lines += ["", f"(b) planted facts in synthetic agent sessions ({f['n']} asks: each fact as "
                  "question and as paraphrase, separate requests continuing the same history):"]
        lines.append(
            f"  evidence recall {fmt(f['recalled'], 3)} (question {fmt(f['recalled_question'], 3)}, "
            f"paraphrase {fmt(f['recalled_paraphrase'], 3)}, reworded {fmt(f['recalled_reworded'], 3)}; planted in a user turn "
            f"{fmt(f['recalled_user'], 3)}, in a tool output {fmt(f['recalled_tool'], 3)}); loaded "
            f"event holds the value {fmt(f['loaded_fact_event'], 3)}; errors {f['errors']} "
            f"({f['over_window']} over window, {f['rejected']} rejected upstream); "
            f"searches {fmt(f['searches'], 2)}, loads {fmt(f['loads'], 2)} per ask; turn/client "
            f"tokens {fmt(f['turn_share'], 3)}; p50 {fmt(f['latency_p50_s'], 3)} s")
        lines.append(f"  gateway's own search over the whole session: hit@1 {fmt(f['hit1'], 3)}, hit@5 "
                     f"{fmt(f['hit5'], 3)} (an event holding the value)")
        lines.append(f"  the value was already in the prompt (summary block / structured state) in "
                     f"{fmt(f['value_in_view'], 3)} of asks, its raw statement in {fmt(f['raw_in_view'], 3)}")
        if f["misses"]:
            lines.append(f"  missed: {', '.join(f['misses'][:12])}{' ...' if len(f['misses']) > 12 else ''}")
    if (lat := result.get("latency")):
        lines += ["", f"(c) session_search via RecallTools.run on a {lat['events']}-event session, "
                  f"{lat['queries']} queries, warm:"]
        for label in ("hidden scope", "whole session"):
            lines.append(f"  {label:<14} p50 {lat[label + '_p50_ms']:6.2f} ms  p99 {lat[label + '_p99_ms']:6.2f} ms"
                         + (f"  ({lat['excluded']} visible events excluded)" if label == "hidden scope" else ""))
    if (tt := result.get("tool_times")):
        lines.append("  in-turn recall tool times (first search of a session includes indexing it): " + "; ".join(
            f"{k} n={len(v)} p50 {percentile(v, 50) * 1e3:.1f} ms max {max(v) * 1e3:.0f} ms"
            for k, v in tt.items() if v))
    lines += ["", "targets:", *result["checks"]]
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def checks(result: dict) -> list[str]:
    """The recall targets, side by side with sending the same request direct (no gateway)."""
    ok = lambda cond: "OK" if cond else "MISS"  # noqa: E731
    out = [f"{'figure':<52} {'direct':<26} {'through Palimpsest':<44} target"]
    lme = {s["mode"]: s for s in result.get("longmemeval", [])}
    f = result.get("facts")
    if (s := lme.get("json")):
        split = s["by_split"]
        parts = ", ".join(f"{k} {v['loaded_evidence']:.3f}" for k, v in split.items())
        out.append(f"{'LongMemEval evidence recall, 32k, top hit read':<52} "
                   f"{'fits ' + format(s['direct_fits'], '.3f') + ' (rest rejected)':<26} "
                   f"{format(s['loaded_evidence'], '.3f') + ' (' + parts + ')':<44} >= 0.95 "
                   f"{ok(s['loaded_evidence'] >= 0.95)}")
        parts = ", ".join(f"{k} {v['reaches']:.3f}" for k, v in split.items())
        out.append(f"{'LongMemEval evidence reaches the model, 32k':<52} "
                   f"{'fits ' + format(s['direct_reaches'], '.3f') + ' (no window ' + format(s['unlimited_reaches'], '.3f') + ')':<26} "
                   f"{format(s['reaches'], '.3f') + ' (' + parts + ')':<44} >= 0.95 "
                   f"{ok(s['reaches'] >= 0.95)}")
        out.append(f"{'  ... every evidence turn of the case reaches it':<52} "
                   f"{format(s['direct_reaches_all'], '.3f'):<26} {format(s['reaches_all'], '.3f'):<44}")
        out.append(f"{'  ... in any passage of the search result (top 3)':<52} {'':<26} "
                   f"{format(s['passage_evidence'], '.3f'):<44}")
        out.append(f"{'  gold answer words: top passage / whole result':<52} {'':<26} "
                   f"{format(s['top_passage_words'], '.3f') + ' / ' + format(s['result_words'], '.3f') + ' (all words: ' + format(s['top_passage_words_full'], '.3f') + ' / ' + format(s['result_words_full'], '.3f') + ')':<44}")
        parts = ", ".join(f"{k} {v['evidence_available']:.3f}" for k, v in split.items())
        out.append(f"{'  ... read, in the view or in the auto block':<52} {'':<26} "
                   f"{format(s['evidence_available'], '.3f') + ' (' + parts + ')':<44} "
                   f"(auto block holds it {s['auto_evidence']:.3f})")
        out.append(f"{'answering request / full context':<52} {'1.000 (when it fits)':<26} "
                   f"{format(s['answer_share'], '.3f'):<44} <= 0.06 {ok(s['answer_share'] <= 0.06)}")
        out.append(f"{'whole recall turn / full context':<52} {'1.000 (when it fits)':<26} "
                   f"{format(s['turn_share'], '.3f') + ' (' + format(s['from_passage'], '.2f') + ' answered from a passage)':<44} "
                   f"<= 0.08 {ok(s['turn_share'] <= 0.08)}")
    if (s := lme.get("steady")):
        out.append(f"{'  after catch-up: whole turn / full context':<52} {'':<26} {format(s['turn_share'], '.3f'):<44} "
                   f"<= 0.08 {ok(s['turn_share'] <= 0.08)}")
    if f:
        out.append(f"{'planted facts incl. paraphrases, 32k sessions':<52} "
                   f"{'fits ' + format(f['direct_fits'], '.3f') + ' (rest rejected)':<26} "
                   f"{format(f['recalled'], '.3f') + ' (q ' + format(f['recalled_question'], '.3f') + ', p ' + format(f['recalled_paraphrase'], '.3f') + ')':<44} "
                   f">= 0.95 {ok(f['recalled'] >= 0.95)}")
        out.append(f"{'  ... in the answer or verbatim in the view':<52} {'':<26} {format(f['available'], '.3f'):<44}")
        out.append(f"{'planted facts, paraphrased questions (both kinds)':<52} {'':<26} "
                   f"{format(f['recalled_paraphrased'], '.3f'):<44} >= 0.9 {ok(f['recalled_paraphrased'] >= 0.9)}")
    errors = sum(s["errors"] for s in result.get("longmemeval", [])) + (f["errors"] if f else 0)
    over = sum(s["over_window"] for s in result.get("longmemeval", [])) + (f["over_window"] if f else 0)
    out.append(f"{'errors / upstream requests over the window':<52} {'':<26} {f'{errors} / {over}':<44} 0 {ok(errors == 0)}")
    if (lat := result.get("latency")):
        out.append(f"{'search p50, ~500-event session':<52} {'':<26} "
                   f"{format(lat['hidden scope_p50_ms'], '.2f') + ' ms':<44} <= 20 ms {ok(lat['hidden scope_p50_ms'] <= 20)}")
    return out


async def run(args) -> dict:
    quiet_logs()
    notes = [machine_note()]
    started = time.perf_counter()
    timings = {}
    tool_times: dict[str, list[float]] = {}
    result: dict = {"notes": notes}
    cases = load_cases() if args.cases else []
    if args.split != "all":
        cases = [c for c in cases if split_of(c["question_id"]) == args.split]
    if args.case_ids:
        cases = [c for c in cases if c["question_id"] in args.case_ids.split(",")]
    cases = cases[: args.cases]
    if cases:
        t = time.perf_counter()
        rows, bench = await longmemeval(args, cases, tool_times)
        timings["longmemeval"] = time.perf_counter() - t
        try:
            result["longmemeval_rows"] = rows
            result["longmemeval"] = [lme_summary([r for r in rows if r["mode"] == m])
                                     for m in ("json", "stream", "steady") if any(r["mode"] == m for r in rows)]
            if args.queries:
                t = time.perf_counter()
                result["latency"] = await search_latency(args, bench, cases)
                timings["latency"] = time.perf_counter() - t
        finally:
            await bench.stop()
        notes.append(f"LongMemEval: {len(cases)} cases (abstention cases skipped: no evidence turn), "
                     f"streaming subset {min(args.stream_cases, len(cases))}, after-catch-up subset "
                     f"{min(args.steady_cases, len(cases))}")
    if args.seed_list:
        t = time.perf_counter()
        fact_rows = await planted(args, tool_times)
        timings["facts"] = time.perf_counter() - t
        result["facts_rows"] = fact_rows
        result["facts"] = facts_summary(fact_rows)
    result["tool_times"] = tool_times
    result["checks"] = checks(result)
    notes.append("the puppet loads only the top search hit and answers with the first 2,000 chars "
                 "of the loaded page; a real model could read further hits or pages")
    notes.append("section times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
                 + f"; total {time.perf_counter() - started:.0f}s")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a handful of cases, < 3 minutes")
    parser.add_argument("--cases", type=int, default=None, help="LongMemEval cases (default all; quick 5)")
    parser.add_argument("--stream-cases", type=int, default=None, help="of those, also streamed (default 10; quick 2)")
    parser.add_argument("--steady-cases", type=int, default=None,
                        help="of those, also asked after the summary caught up (default 10; quick 2)")
    parser.add_argument("--seeds", default=None, help="synthetic sessions with planted facts (default 1,2,3,4; quick 1)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--queries", type=int, default=None, help="search latency queries (default 200; quick 60)")
    parser.add_argument("--arrival-prior", type=float, default=3.0,
                        help="seconds per summary call the gateway assumes before each arrival (its own "
                        "prior); 0 = keep what it learnt from the instant puppet (arrivals then get "
                        "summarised synchronously)")
    parser.add_argument("--profile", choices=("economy", "balanced", "fidelity"), default=None,
                        help="policy profile of the gateway (default: the gateway's)")
    parser.add_argument("--auto-tokens", type=int, default=None,
                        help="recall.auto_tokens of the gateway (proactive recall; default: the gateway's)")
    parser.add_argument("--passage-tokens", type=int, default=None,
                        help="recall.passage_tokens (answerable search results; 0 = snippets only, the "
                        "model loads the top hit)")
    parser.add_argument("--embeddings-url", default="",
                        help="recall.embeddings_url: an OpenAI-compatible /v1 base (e.g. bench/minilm.py); "
                        "default the embedded WordLlama")
    parser.add_argument("--embeddings-dim", type=int, default=384)
    parser.add_argument("--embedder", choices=("wordllama", "minilm"), default=None,
                        help="recall.embedder (default: the gateway's); minilm runs in process with the "
                        "bench's vector cache (bench/minilm.py)")
    parser.add_argument("--no-expand", action="store_true", help="recall.expand_queries = false")
    parser.add_argument("--no-index", action="store_true", help="policy hidden_index_ratio = 0")
    parser.add_argument("--split", choices=("all", "tune", "held-out"), default="all",
                        help="LongMemEval cases of this split only (bench/ranking.py split_of(question_id))")
    parser.add_argument("--case-ids", default="", help="LongMemEval question_ids, comma-separated (default all)")
    parser.add_argument("--compare", action="store_true",
                        help="run the baseline first (wordllama, no expansion, no index) and print it "
                        "side by side with this configuration")
    parser.add_argument("--ranking", choices=("default", "pre"), default="default",
                        help="pre: the search ranking before exchange pairing and tool-result lines "
                        "(the same tree otherwise), to measure what they change")
    parser.add_argument("--verbose", action="store_true", help="one line per case on stderr")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    q = args.quick
    if args.cases is None:
        args.cases = 5 if q else 10_000  # 10,000: all of them
    args.stream_cases = args.stream_cases if args.stream_cases is not None else (2 if q else 10)
    args.steady_cases = args.steady_cases if args.steady_cases is not None else (2 if q else 10)
    args.seed_list = [int(s) for s in (args.seeds or ("1" if q else "1,2,3,4")).split(",") if s]
    args.queries = args.queries if args.queries is not None else (60 if q else 200)
    args.arrival_prior = args.arrival_prior or None
    args.recall_settings = {k: v for k, v in (("auto_tokens", args.auto_tokens),
                                               ("passage_tokens", args.passage_tokens)) if v is not None}
    args.policy_settings = {"policy": {"profile": args.profile}} if args.profile else {}
    if args.no_index:
        args.policy_settings.setdefault("policy", {})["hidden_index_ratio"] = 0.0
    if args.embedder:
        args.recall_settings["embedder"] = args.embedder
    if args.no_expand:
        args.recall_settings["expand_queries"] = False
    if args.embedder == "minilm":
        _minilm_with_cache()
    if args.embeddings_url:
        args.recall_settings.update(embeddings_url=args.embeddings_url, embeddings_model="all-MiniLM-L6-v2",
                                    embeddings_dim=args.embeddings_dim)
    if args.ranking == "pre":
        _rank_as_before()
    if args.compare:
        run_and_report(compared, render_compared, args)
    else:
        run_and_report(run, render, args)


def _minilm_with_cache() -> None:
    """The gateway's MiniLM embedder loads bench/minilm.py's model: the same weights and forward
    pass, with 2 worker threads and the SQLite vector cache shared by runs."""
    import minilm
    from store.minilm import MiniLMEmbedder

    model: list = []

    def loaded(self):
        if not model:
            model.append(minilm.MiniLM(cache_path=minilm.default_cache_path() or None))
        return model[0]

    MiniLMEmbedder.loaded = loaded


async def compared(args) -> dict:
    """The baseline (WordLlama, no query expansion, no hidden-context index), then `args`."""
    import copy

    base = copy.copy(args)
    base.recall_settings = {k: v for k, v in args.recall_settings.items() if k not in ("embedder", "expand_queries")}
    base.recall_settings["expand_queries"] = False
    base.policy_settings = copy.deepcopy(args.policy_settings)
    base.policy_settings.setdefault("policy", {})["hidden_index_ratio"] = 0.0
    before = await run(base)
    after = await run(args)
    return {"before": before, "after": after, "notes": after["notes"],
            "label": f"embedder {args.embedder or 'wordllama'}, expansion {'off' if args.no_expand else 'on'}, "
                     f"index {'off' if args.no_index else 'on'}"}


def render_compared(result: dict) -> str:
    before, after = result["before"], result["after"]
    rows = []
    for label, pick, target in (
        ("planted facts recalled, all", lambda r: r["facts"]["recalled"], ">= 0.95"),
        ("  question", lambda r: r["facts"]["recalled_question"], ""),
        ("  paraphrased (hand-written + reworded)", lambda r: r["facts"]["recalled_paraphrased"], ">= 0.9"),
        ("    hand-written paraphrase", lambda r: r["facts"]["recalled_paraphrase"], ""),
        ("    reworded by rule", lambda r: r["facts"]["recalled_reworded"], ""),
        ("  search hit@1 / hit@5", lambda r: f"{r['facts']['hit1']:.3f} / {r['facts']['hit5']:.3f}", ""),
        ("LongMemEval evidence recall, 32k (top hit read)", lambda r: r["longmemeval"][0]["loaded_evidence"], ">= 0.95"),
        ("  held-out split", lambda r: r["longmemeval"][0]["by_split"].get("held-out", {}).get("loaded_evidence"), ">= 0.95"),
        ("  read, in view or in the auto block", lambda r: r["longmemeval"][0]["evidence_available"], ""),
        ("LongMemEval evidence reaches the model (answer round)", lambda r: r["longmemeval"][0]["reaches"], ">= 0.95"),
        ("  held-out split", lambda r: r["longmemeval"][0]["by_split"].get("held-out", {}).get("reaches"), ">= 0.95"),
        ("  search hit@1 / hit@5", lambda r: f"{r['longmemeval'][0]['hit1']:.3f} / {r['longmemeval'][0]['hit5']:.3f}", ""),
        ("  cases", lambda r: r["longmemeval"][0]["n"], ""),
        ("search p50 ms (~500 events)", lambda r: r["latency"]["hidden scope_p50_ms"], "<= 20"),
    ):
        cells = []
        for r in (before, after):
            try:
                value = pick(r)
            except (KeyError, IndexError, TypeError):
                value = None
            cells.append("-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value))
        rows.append(f"{label:<50} {cells[0]:>16} {cells[1]:>16} {target:>8}")
    head = f"{'figure':<50} {'before':>16} {'after':>16} {'target':>8}"
    return "\n".join([f"before: wordllama, expansion off, index off; after: {result['label']}", head, "-" * len(head),
                      *rows, "", "after, in full:", render(after)])


def _rank_as_before() -> None:
    """Every SearchIndex built in this process ranks as before exchange pairing and tool-result lines (the `pre` ranking of bench/ranking.py)."""
    from store.index import Ranking, SearchIndex

    before = Ranking(role_prior=0.0, exchange=0.0, tool_lines=0.0, text_extra=0)
    original = SearchIndex.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.ranking = before

    SearchIndex.__init__ = init


if __name__ == "__main__":
    main()
