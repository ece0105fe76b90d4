"""Summary jobs (DESIGN §4): incremental, one at a time per session, async by default.

After a response whose view passed ``summary_trigger_ratio`` of the window, a job is queued
(bounded queue, N workers). A request whose view passes ``sync_compaction_ratio`` waits for
the session's running job or starts one, but never longer than ``sync_budget_s``: a delta too
large to fold in time keeps running in the background while the request goes ahead tailored.

A job takes the previous checkpoint on the path, chooses a boundary that keeps the newest
rounds raw, folds the delta in chunks (previous summary + chunk -> new summary), validates each
summary (retry once), and stores a new checkpoint. Any failure leaves the previous checkpoint in
place and never fails a user's request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import orjson

from gateway.http.upstream import Upstream
from policies import (
    Policy,
    TokenCounter,
    choose_boundary,
    chunk_messages,
    extract_exact_values,
    format_transcript,
    merge_state,
    render_forked_summary_request,
    render_summary_request,
    validate_summary,
)
from store import acquire as store_acquire, call as store_call
from store.checkpoints import Checkpoint
from store.ledger import SessionRef

log = logging.getLogger("palimpsest.summary")
# Tokens a summary request needs besides the transcript: instruction, previous summary, values.
SUMMARY_PROMPT_ROOM = 4000
VALIDATED_VALUES = 12


class SummaryFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class SummaryJob:
    ref: SessionRef
    model: str
    policy: Policy
    history: list[dict]  # the path's messages (answer included), no system messages
    ids: list[str]
    auth: str | None  # the client's Authorization, in memory only, for upstreams that need it
    parent_view: list[dict] | None = None  # for cache-safe forking
    mode: str = "async"
    budget: int = 0  # the request model's prompt budget: scales the raw tail kept after the boundary


class Summarizer:
    def __init__(self, *, upstream: Upstream, checkpoints, counter: TokenCounter, metrics, workers: int, queue_size: int,
                 windows=None) -> None:
        self.upstream = upstream
        self.windows = windows
        self.checkpoints = checkpoints
        self.counter = counter
        self.metrics = metrics
        self._queue: asyncio.Queue[SummaryJob] = asyncio.Queue(maxsize=queue_size)
        self._workers: list[asyncio.Task] = []
        self._worker_count = workers
        self._running: dict[str, asyncio.Task] = {}
        self._queued: set[str] = set()
        # Seconds per summary call, learnt; decides whether a sync fold can finish in time.
        self._call_seconds = 3.0

    @property
    def idle(self) -> bool:
        """No job queued or running."""
        return not self._running and self._queue.empty()

    async def start(self) -> None:
        self._workers = [asyncio.create_task(self._work(), name=f"summary-worker-{i}") for i in range(self._worker_count)]

    async def close(self, timeout: float) -> None:
        """Drain: let queued and running jobs finish within `timeout`, then cancel the rest."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
            running = list(self._running.values())
            if running:
                await asyncio.wait(running, timeout=timeout)
        except asyncio.TimeoutError:
            log.warning("summary jobs still pending at shutdown: %d", self._queue.qsize() + len(self._running))
        for task in [*self._workers, *self._running.values()]:
            task.cancel()
        await asyncio.gather(*self._workers, *self._running.values(), return_exceptions=True)

    # -- triggers ----------------------------------------------------------------------------

    def after_turn(self, turn, answer_event) -> None:
        view = turn.view
        policy = view.policy
        if turn.ref is None or policy is None or not view.budget:
            return
        if view.upstream_tokens < policy.summary_trigger_ratio * view.budget:
            return
        key = turn.ref.key
        if key in self._running or key in self._queued:
            self.metrics.summary_dropped.labels("busy").inc()
            return
        job = SummaryJob(
            turn.ref, turn.chat.model, policy, [*turn.chat.history, answer_event.message], [*turn.chat.ids, answer_event.id],
            turn.auth, view.messages, budget=view.budget,
        )
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.metrics.summary_dropped.labels("queue_full").inc()
            return
        self._queued.add(key)
        self.metrics.summary_enqueued.labels("async").inc()
        self.metrics.summary_queue_depth.set(self._queue.qsize())

    async def sync(self, ref: SessionRef, chat, policy: Policy, auth: str | None, *, deadline: float, budget: int) -> Checkpoint | None:
        """Join the session's running job or start one; wait until `deadline` at most."""
        task = self._running.get(ref.key)
        if task is None:
            job = SummaryJob(ref, chat.model, policy, chat.history, chat.ids, auth, None, "sync", budget)
            calls = await self._plan(job)
            if calls is None:
                return None
            self.metrics.summary_enqueued.labels("sync").inc()
            task = self._launch(job)
            if calls * self._call_seconds > deadline - time.perf_counter():
                return None  # cannot fold in time: it catches up in the background
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(task), remaining)
        except asyncio.TimeoutError:
            return None
        except Exception:
            return None

    # -- running -----------------------------------------------------------------------------

    def _launch(self, job: SummaryJob) -> asyncio.Task:
        task = asyncio.create_task(self._guarded(job))
        self._running[job.ref.key] = task
        task.add_done_callback(lambda t, key=job.ref.key: self._running.pop(key, None) if self._running.get(key) is t else None)
        return task

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            self._queued.discard(job.ref.key)
            self.metrics.summary_queue_depth.set(self._queue.qsize())
            try:
                running = self._running.get(job.ref.key)
                if running is not None:
                    await asyncio.wait([running])  # one job per session at a time
                await self._launch(job)
            except Exception:
                pass  # _guarded already counted and logged it
            finally:
                self._queue.task_done()

    async def _guarded(self, job: SummaryJob) -> Checkpoint | None:
        started = time.perf_counter()
        try:
            cp = await asyncio.wait_for(self._run(job), job.policy.summary_timeout_s)
        except asyncio.TimeoutError:
            self.metrics.summary_errors.labels("timeout").inc()
            log.warning("summary job timed out", extra={"fields": {"session": job.ref.key}})
            return None
        except SummaryFailed as exc:
            self.metrics.summary_errors.labels(exc.reason).inc()
            log.warning("summary job failed", extra={"fields": {"session": job.ref.key, "reason": exc.reason}})
            return None
        except asyncio.CancelledError:
            raise
        except Exception:
            self.metrics.summary_errors.labels("internal").inc()
            log.exception("summary job crashed")
            return None
        if cp is not None:
            self.metrics.summary_seconds.labels(job.mode).observe(time.perf_counter() - started)
        return cp

    async def _plan(self, job: SummaryJob) -> int | None:
        """Summary call latencies the job needs end to end (parallel parts count once per
        wave, plus the merge), or None when there is nothing to cover."""
        bounds = await self._bounds(job)
        if bounds is None:
            return None
        start, end, _ = bounds
        chunks = len(chunk_messages(job.history[start:end], await self._chunk_tokens(job), self.counter))
        parallel = job.policy.summary_parallel
        if chunks > 1 and parallel > 1:
            return -(-chunks // parallel) + 1
        return chunks

    async def _chunk_tokens(self, job: SummaryJob) -> int:
        """Transcript tokens per summary call: the policy's, but never more than the summary
        model's window holds next to the prompt, the previous summary and the answer."""
        policy = job.policy
        window = await self.windows.window(policy.summary_model or job.model, job.auth) if self.windows else 10**9
        room = window - 2 * policy.summary_max_words - SUMMARY_PROMPT_ROOM
        return max(1000, min(policy.summary_chunk_tokens, room))

    async def _bounds(self, job: SummaryJob) -> tuple[int, int, Checkpoint | None] | None:
        positions = {eid: i for i, eid in enumerate(job.ids)}
        found = await store_call(self.checkpoints.newest_on_path, job.ref.key, positions)
        previous, pos = found if found else (None, -1)
        start = pos + 1
        policy = job.policy.for_budget(job.budget) if job.budget else job.policy
        cut = choose_boundary(job.history[start:], self.counter, policy, keys=job.ids[start:])
        if not cut:
            return None
        return start, start + cut, previous

    async def _run(self, job: SummaryJob) -> Checkpoint | None:
        # One replica summarises a session at a time: a lease in the store, which expires if
        # its holder dies (store.acquire). The bounds are read under it, so a replica that
        # follows another sees the checkpoint the other just wrote.
        lease = await store_acquire(self.checkpoints, "summary:" + job.ref.key, job.policy.summary_timeout_s + 30)
        if lease is None:
            self.metrics.summary_dropped.labels("leased").inc()
            return None
        try:
            return await self._run_leased(job)
        finally:
            await lease.release()

    async def _run_leased(self, job: SummaryJob) -> Checkpoint | None:
        bounds = await self._bounds(job)
        if bounds is None:
            return None
        start, end, previous = bounds
        delta, delta_ids = job.history[start:end], job.ids[start:end]
        policy = job.policy
        delta_state = extract_exact_values(delta)
        state = merge_state(previous.state if previous else None, delta_state)
        summary = previous.summary if previous else None
        chunks = chunk_messages(delta, await self._chunk_tokens(job), self.counter)
        if len(chunks) > 1 and policy.summary_parallel > 1:
            summary = await self._map_reduce(job, summary, chunks, state)
        else:
            for chunk in chunks:
                summary = await self._fold(job, summary, chunk, single=len(chunks) == 1)
        covered_tokens = (previous.covered_tokens if previous else 0) + sum(
            self.counter.count_message(m, k) for m, k in zip(delta, delta_ids)
        )
        summary_tokens = self.counter.count_text(summary or "")
        cp = await store_call(
            self.checkpoints.add, job.ref.key, boundary=job.ids[end - 1], summary=summary or "", state=state, covered_tokens=covered_tokens,
            covered_events=end, model=policy.summary_model or job.model, mode=job.mode,
            previous=previous.id if previous else None, summary_tokens=summary_tokens,
        )
        self.metrics.summary_created.labels(job.mode).inc()
        self.metrics.summary_input_events.inc(len(delta))
        if covered_tokens:
            self.metrics.summary_compression.observe(summary_tokens / covered_tokens)
        log.info("checkpoint created", extra={"fields": {"session": job.ref.key, "checkpoint": cp.id, "covered_events": end, "mode": job.mode}})
        return cp

    async def _fold(self, job: SummaryJob, summary: str | None, chunk: list[dict], *, single: bool) -> str:
        """`summary` updated with one chunk of the delta."""
        policy = job.policy
        # The summary is asked to keep the chunk's own values (the structured state carries
        # every value of the session beside it anyway), and validation checks the first few
        # of each kind: a 60-round delta can name hundreds of paths.
        chunk_state = extract_exact_values(chunk, cap=VALIDATED_VALUES * 4)
        checked = {kind: values[:VALIDATED_VALUES] for kind, values in chunk_state.items()}
        if policy.summary_cache_fork and job.parent_view and single:
            messages = render_forked_summary_request(job.parent_view, summary, chunk_state, policy)
        else:
            messages = render_summary_request(summary, chunk_state, format_transcript(chunk, policy), policy)
        return await self._summarize(job, messages, checked)

    async def _map_reduce(self, job: SummaryJob, previous: str | None, chunks: list[list[dict]], state: dict) -> str:
        """Summarise the chunks at once (at most summary_parallel calls in flight), then merge
        the part summaries into the previous summary with one more call."""
        gate = asyncio.Semaphore(job.policy.summary_parallel)

        async def part(chunk: list[dict]) -> str:
            async with gate:
                return await self._fold(job, None, chunk, single=False)

        parts = await asyncio.gather(*(part(c) for c in chunks))
        transcript = "\n\n".join(f"[summary of part {i + 1} of {len(parts)}, in order]\n{text}" for i, text in enumerate(parts))
        checked = {kind: values[:VALIDATED_VALUES] for kind, values in state.items()}
        merged_state = {kind: values[: VALIDATED_VALUES * 4] for kind, values in state.items()}
        messages = render_summary_request(previous, merged_state, transcript, job.policy)
        return await self._summarize(job, messages, checked)

    async def _summarize(self, job: SummaryJob, messages: list[dict], chunk_state: dict) -> str:
        problems: list[str] = []
        for _attempt in range(2):
            text = await self._call(job, messages)
            problems = validate_summary(text, chunk_state, job.policy)
            if not problems:
                return text
            self.metrics.summary_invalid.inc()
            # Problems name sections and counts, never summary text.
            log.warning("summary rejected", extra={"fields": {"session": job.ref.key, "problems": problems}})
        raise SummaryFailed("invalid_format")

    async def _call(self, job: SummaryJob, messages: list[dict]) -> str:
        policy = job.policy
        base = (policy.summary_base_url or self.upstream.base_url).rstrip("/")
        headers = {"Content-Type": "application/json", "x-palimpsest-purpose": "summary"}
        key = policy.summary_api_key or (None if policy.summary_base_url else self.upstream.api_key)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        elif job.auth:
            headers["Authorization"] = job.auth
        body = {"model": policy.summary_model or job.model, "messages": messages, "max_tokens": policy.summary_max_words * 2, "temperature": 0}
        started = time.perf_counter()
        try:
            async with self.upstream.request(self.upstream.api, "POST", base + "/chat/completions", data=orjson.dumps(body), headers=headers) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise SummaryFailed(f"upstream_{resp.status}")
        except SummaryFailed:
            raise
        except Exception as exc:
            raise SummaryFailed("upstream_unreachable") from exc
        elapsed = time.perf_counter() - started
        self._call_seconds = 0.7 * self._call_seconds + 0.3 * elapsed
        self.metrics.summary_llm_seconds.observe(elapsed)
        try:
            data = orjson.loads(payload)
            text = data["choices"][0]["message"]["content"] or ""
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SummaryFailed("bad_response") from None
        usage = data.get("usage") or {}
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        self.metrics.summary_input_tokens.inc(prompt)
        self.metrics.summary_output_tokens.inc(completion)
        self.metrics.summary_cache_read_tokens.inc((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        self.metrics.tokens_spent_overhead.labels("summary").inc(prompt + completion)
        return text
