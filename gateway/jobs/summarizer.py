"""Summary jobs (docs/architecture.md, summary checkpoints): incremental, one at a time per
session, async by default, and cheap when the summary model fails.

After a response whose view passed ``summary_trigger_ratio`` of the window, a job is queued
(bounded queue, N workers). A request whose view passes ``sync_compaction_ratio`` waits for
the session's running job or starts one, but never longer than ``sync_budget_s``: a delta too
large to fold in time keeps running in the background while the request goes ahead tailored.
Sync jobs count against the same bounds: at most ``workers`` jobs call the model at once,
async and sync together, and a sync job starts only when one of them is free; otherwise the
request goes out tailored (with the exact values) instead of piling up jobs in memory.

Cost is bounded per job and per tenant: a job folds at most ``summary.max_fold_tokens`` of
history with the model (an older remainder of a bigger delta becomes deterministic state), and
every call is paid from the tenant's token budget (``gateway.jobs.budget``); a job the budget
cannot cover writes deterministic state too.

A job takes the previous checkpoint on the path, chooses a boundary that keeps the newest
rounds raw, folds the delta in chunks (previous summary + chunk -> new summary; big deltas as
map-reduce), validates each summary and stores a new checkpoint.

Faults (``gateway.jobs.backoff``): a failed job puts its session into exponential backoff with
jitter (never shorter than an upstream ``Retry-After``); a per-model circuit breaker stops
every session from calling a model that keeps failing (transport faults, 5xx, 429) and lets one
probe through after a cool-down. What one session's content causes (a 400/413/422, a rejected
summary) never counts toward the breaker: one tenant cannot switch summaries off for all. A rejected summary (off-format) is retried once with the reasons, and only while the
session has no rejection history. A session whose summaries keep being rejected is
*degraded*: its jobs write a deterministic state-only checkpoint (model ``"deterministic"``:
user requests, decisions and exact values copied without a model), so compaction proceeds
whatever the model; the next model summary that passes replaces it. A plain outage (5xx, 429,
timeout) only waits: the view is tailored with the exact values meanwhile. No failure ever
fails a user's request.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.pipeline.offload import pure as off_loop  # big deltas are read in a worker thread, off the event loop
from gateway.http.routing import Upstreams
from gateway.jobs.backoff import Breaker, SessionBackoff
from gateway.jobs.pace import summary_due
from gateway.settings import SummarySettings
from gateway.jobs.budget import TenantBudget, catch_up_pays
from gateway.jobs.checked import check as checked_checkpoint, covered_values
from gateway.jobs.summary_model import (Auth, BudgetExceeded, SummaryFailed, SummaryJob, SummaryModel, SummaryRejected,
                                        fork_applies, fork_parent)
from policies import Policy, TokenCounter, choose_boundary, chunk_messages, extract_exact_values, merge_state
from policies.extraction import extract_notes
from policies.holdout import HOLDOUT
from policies.summary import DETERMINISTIC_MODEL, render_state_summary
from store import acquire as store_acquire, call as store_call
from store.records import Checkpoint, SessionRef

log = logging.getLogger("palimpsest.summary")
BREAKERS_TRACKED = 1000

__all__ = ["Summarizer", "SummaryFailed", "SummaryJob", "SummaryRejected"]


def state_summary(messages: list[dict], previous: str | None, state: dict, policy: Policy) -> str:
    """The deterministic summary of `messages` on top of `previous`: notes read from every
    message, seconds of CPU for a 10k-message delta, so the job runs it off the event loop."""
    return render_state_summary(previous, extract_notes(messages), state, policy)


KNOWN_SINCE = 64  # events a checkpoint names as already stored (those nearest the head suffice)


def written_since(ledger, session_key: str, after: str) -> list[str]:
    """The ids on the path to the session's newest event after `after` (newest first, at most
    KNOWN_SINCE): what the session held, beyond the summarised request, when a checkpoint was
    stored. Views take the furthest of them on a request's path as the checkpoint's earliest
    adoption point, whichever branch or retry the request is on."""
    record, out = ledger.session(session_key), []
    current = record.head if record is not None else None
    while current is not None and current != after and len(out) < KNOWN_SINCE:
        out.append(current)
        event = ledger.get(session_key, current)
        current = event.parent if event is not None else None
    return out


class Summarizer:
    def __init__(self, *, upstream: Upstreams, checkpoints, counter: TokenCounter, metrics, workers: int, queue_size: int,
                 windows=None, config=None, ledger=None) -> None:
        self.upstream = upstream
        self.ledger = ledger  # to tell an arrival (a path it holds none of) on the sync path
        self.windows = windows
        self.checkpoints = checkpoints
        self.counter = counter
        self.metrics = metrics
        self.config = c = config or SummarySettings()
        self._queue: asyncio.Queue[SummaryJob] = asyncio.Queue(maxsize=queue_size)
        self._workers: list[asyncio.Task] = []
        self._worker_count = workers
        # Jobs in memory at once (queued + running, sync ones included): beyond it, tailoring.
        self._max_running = workers + queue_size
        self._slots = asyncio.Semaphore(workers)  # jobs calling the model at once, sync ones included
        self._running: dict[str, asyncio.Task] = {}
        self._queued: set[str] = set()
        self._in_hand = 0  # taken off the queue by a worker, not launched yet
        self.backoff = SessionBackoff(base_s=c.backoff_base_s, max_s=c.backoff_max_s, jitter=c.backoff_jitter,
                                      degrade_after=c.deterministic_after)
        self.breakers: dict[tuple[str, str], Breaker] = {}
        self.budget = TenantBudget(c.tenant_tokens_per_hour, metrics)
        self.model = SummaryModel(upstream=upstream, windows=windows, counter=counter, metrics=metrics,
                                  backoff=self.backoff, outcome=self._outcome, budget=self.budget)

    @property
    def _call_seconds(self) -> float:
        """Seconds per summary call, learnt (tests and benchmarks reset it)."""
        return self.model.call_seconds

    @_call_seconds.setter
    def _call_seconds(self, value: float) -> None:
        self.model.call_seconds = value

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
        if turn.ref is None or policy is None or not view.budget or view.arm == HOLDOUT:
            return  # a holdout session is sent as direct: it gets no summaries
        if not summary_due(turn, self.counter, fork_applies(turn)):  # the cost model (policies/cost.py)
            return
        key = turn.ref.key
        if key in self._running or key in self._queued:
            self.metrics.summary_dropped.labels("busy").inc()
            return
        if self._full():
            self.metrics.summary_dropped.labels("queue_full").inc()
            return
        job = SummaryJob(
            turn.ref, turn.chat.model, policy, [*turn.chat.history, answer_event.message], [*turn.chat.ids, answer_event.id],
            turn.auth, fork_parent(turn, answer_event.message), budget=view.budget,  # the provider's cached prefix
        )
        if not self._admit(job):
            return
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._release(job)
            self.metrics.summary_dropped.labels("queue_full").inc()
            return
        self._queued.add(key)
        self.metrics.summary_enqueued.labels("async").inc()
        self.metrics.summary_queue_depth.set(self._queue.qsize())

    async def sync(self, ref: SessionRef, chat, policy: Policy, auth: Auth, *, deadline: float, budget: int) -> Checkpoint | None:
        """Join the session's running job or start one; wait until `deadline` at most."""
        task = self._running.get(ref.key)
        if task is None:
            if await self._arrival(ref, chat) and not catch_up_pays(chat.history, chat.ids, policy, budget, self.counter):
                self.metrics.summary_skipped.labels("arrival").inc()
                return None  # tailored with the exact values and recall; folded once the session goes on
            if self._full():
                self.metrics.summary_dropped.labels("queue_full").inc()
                return None  # degrade to tailoring, not to unbounded jobs in memory
            if self._slots.locked():
                self.metrics.summary_dropped.labels("workers_busy").inc()
                return None  # every worker is calling the model: the next async job catches up
            job = SummaryJob(ref, chat.model, policy, chat.history, chat.ids, auth, mode="sync", budget=budget)
            if not self._admit(job):
                return None
            calls = 0 if job.deterministic else await self._plan(job)
            if calls is None:
                self._release(job)
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

    async def _arrival(self, ref: SessionRef, chat) -> bool:
        """Does this request bring a history the ledger holds none of? (Asked before the ledger
        sync; ids are chained, so an unknown first event means every event is unknown.)"""
        if self.ledger is None or not chat.ids:
            return False
        return await store_call(self.ledger.get, ref.key, chat.ids[0]) is None

    def _full(self) -> bool:
        return len(self._running) + self._queue.qsize() + self._in_hand >= self._max_running

    # -- may this job call the model? ----------------------------------------------------------

    def _breaker(self, job: SummaryJob) -> Breaker:
        policy = job.policy
        upstream, model = self.model.route(job)
        key = ((policy.summary_base_url or upstream.base_url).rstrip("/"), model)
        breaker = self.breakers.get(key)
        if breaker is None:
            if len(self.breakers) >= BREAKERS_TRACKED:  # model names come from clients: stay bounded
                for old in [k for k, b in self.breakers.items() if b.state == "closed" and not b.consecutive]:
                    del self.breakers[old]
                while len(self.breakers) >= BREAKERS_TRACKED:
                    del self.breakers[next(iter(self.breakers))]
            c = self.config
            breaker = self.breakers[key] = Breaker(failures=c.breaker_failures, cooldown_s=c.breaker_cooldown_s,
                                                   max_s=c.backoff_max_s, jitter=c.backoff_jitter)
        return breaker

    def _admit(self, job: SummaryJob) -> bool:
        """Whether the job runs, and how: with the model, as the breaker's probe, or degraded
        (deterministic, no model call). Skipped jobs are counted, not queued."""
        key = job.ref.key
        degraded = self.backoff.degraded(key)
        if self.backoff.waiting(key):
            if degraded:
                job.deterministic = True
                return True
            self.metrics.summary_skipped.labels("backoff").inc()
            return False
        breaker = self._breaker(job)
        verdict = breaker.admit()
        if verdict == "probe":
            job.probe = breaker
            self._transition("half_open")
        if verdict in ("call", "probe"):
            return True
        if degraded:
            job.deterministic = True  # this session's summaries keep being rejected: do not wait for the model
            return True
        self.metrics.summary_skipped.labels(verdict).inc()
        return False

    def _release(self, job: SummaryJob) -> None:
        if job.probe is not None and job.probe.probing:
            job.probe.release()

    def _transition(self, kind: str | None) -> None:
        if kind:
            self.metrics.summary_breaker_transitions.labels(kind).inc()
            log.warning("summary breaker %s", kind)
        self.metrics.summary_breakers_open.set(sum(b.state != "closed" for b in self.breakers.values()))

    def _outcome(self, job: SummaryJob, ok: bool, outcome: str, *, cause: str = "unavailable",
                 retry_after: float | None = None) -> None:
        self.metrics.summary_calls.labels(outcome).inc()
        if not ok and cause in ("rejected", "content"):
            # Caused by what this session sent (a summary off-format for it, a 4xx for its
            # content): its own backoff handles it; the breaker is shared by every tenant.
            return
        self._transition(self._breaker(job).record(ok, cause=cause, retry_after=retry_after))

    # -- running -----------------------------------------------------------------------------

    def _launch(self, job: SummaryJob) -> asyncio.Task:
        task = asyncio.create_task(self._guarded(job), name=f"summary-job-{job.mode}")
        self._running[job.ref.key] = task
        task.add_done_callback(lambda t, key=job.ref.key: self._running.pop(key, None) if self._running.get(key) is t else None)
        return task

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            self._queued.discard(job.ref.key)
            self.metrics.summary_queue_depth.set(self._queue.qsize())
            self._in_hand += 1
            launched = False
            try:
                running = self._running.get(job.ref.key)
                if running is not None:
                    await asyncio.wait([running])  # one job per session at a time
                task = self._launch(job)
                self._in_hand -= 1
                launched = True
                await task
            except Exception:
                pass  # _guarded already counted and logged it
            finally:
                if not launched:
                    self._in_hand -= 1
                    self._release(job)
                self._queue.task_done()

    async def _guarded(self, job: SummaryJob) -> Checkpoint | None:
        started = time.perf_counter()
        key = job.ref.key
        try:
            async with self._slots:
                cp = await asyncio.wait_for(self._run(job), job.policy.summary_timeout_s)
        except asyncio.TimeoutError:
            self.metrics.summary_errors.labels("timeout").inc()
            if not job.deterministic:
                self._outcome(job, False, "timeout")
            log.warning("summary job timed out", extra={"fields": {"session": key, "retry_in_s": round(self.backoff.failed(key), 1)}})
            return None
        except SummaryFailed as exc:
            self.metrics.summary_errors.labels(exc.reason).inc()
            wait = self.backoff.failed(key, exc.retry_after)
            log.warning("summary job failed", extra={"fields": {"session": key, "reason": exc.reason, "retry_in_s": round(wait, 1)}})
            return None
        except asyncio.CancelledError:
            raise
        except Exception:
            self.metrics.summary_errors.labels("internal").inc()
            self.backoff.failed(key)
            log.exception("summary job crashed")
            return None
        finally:
            self._release(job)
        if cp is not None:
            self.metrics.summary_seconds.labels(job.mode).observe(time.perf_counter() - started)
            if job.fell_back:
                self.backoff.failed(key)  # the model stays on probation: probe it again later
            elif not job.deterministic:
                self.backoff.succeeded(key)
        return cp

    async def _plan(self, job: SummaryJob) -> int | None:
        """Summary call latencies the job needs end to end (parallel parts count once per
        wave, plus the merge), or None when there is nothing to cover."""
        bounds = await self._bounds(job)
        if bounds is None:
            return None
        start, end, _ = bounds
        chunks = len(chunk_messages(job.history[start:end], await self.model.chunk_tokens(job), self.counter))
        parallel = job.policy.summary_parallel
        if chunks > 1 and parallel > 1:
            return -(-chunks // parallel) + 1
        return chunks

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

    def _tokens(self, messages: list[dict], ids: list[str]) -> int:
        return sum(self.counter.count_message(m, k) for m, k in zip(messages, ids))

    def _beyond_fold(self, delta: list[dict], ids: list[str]) -> int:
        """How many of the delta's oldest messages exceed ``max_fold_tokens`` (0: it all fits)."""
        room = self.config.max_fold_tokens
        for i in range(len(delta) - 1, -1, -1):
            room -= self.counter.count_message(delta[i], ids[i])
            if room < 0:
                return i + 1
        return 0

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
        delta_state = await off_loop(extract_exact_values, delta)
        state = merge_state(previous.state if previous else None, delta_state)
        summary = previous.summary if previous else None
        model = policy.summary_model or job.model
        if not job.deterministic:
            older = await off_loop(self._beyond_fold, delta, delta_ids)
            if older:  # too much to fold with the model: the oldest part goes in as state only
                part = delta[:older]
                summary = await off_loop(state_summary, part, summary, await off_loop(extract_exact_values, part), policy)
            try:
                summary = await self.model.write(job, summary, delta[older:], state)
            except SummaryRejected:
                if not self.backoff.degraded(job.ref.key):
                    raise
                job.fell_back = True
            except BudgetExceeded:
                self.metrics.summary_errors.labels("tenant_budget").inc()
                job.fell_back = True
        if job.deterministic or job.fell_back:
            summary = await off_loop(state_summary, delta, previous.summary if previous else None, delta_state, policy)
            model = DETERMINISTIC_MODEL
        checked = await checked_checkpoint(key=job.ref.key, covered=job.history[:end], summary=summary or "", state=state,
                                           covered_state=covered_values(previous, delta_state),
                                           previous_summary=previous.summary if previous else None,
                                           policy=policy, budget=job.budget, counter=self.counter, metrics=self.metrics)
        if checked is None:
            return None  # refused: the old checkpoint stays
        summary, state = checked
        covered_tokens = (previous.covered_tokens if previous else 0) + await off_loop(self._tokens, delta, delta_ids)
        summary_tokens = self.counter.count_text(summary or "")
        meta = {"after": job.ids[-1]}  # views adopt it at their first compaction event after this
        if job.mode != "sync" and self.ledger is not None:
            # ...and after every event the session already held when it was stored: a job that
            # finishes while the next request is under way was not there when that request's
            # view was built, so that request's event must not adopt it when a later request
            # (or a retry of that one, which ends before the stored answer) replays it.
            meta["known_since"] = await store_call(written_since, self.ledger, job.ref.key, job.ids[-1])
        cp = await store_call(
            self.checkpoints.add, job.ref.key, boundary=job.ids[end - 1], summary=summary or "", state=state, covered_tokens=covered_tokens,
            covered_events=end, model=model, mode=job.mode,
            previous=previous.id if previous else None, summary_tokens=summary_tokens,
            meta=meta,
        )
        self.metrics.summary_created.labels(job.mode).inc()
        if model == DETERMINISTIC_MODEL:
            self.metrics.summary_deterministic.labels(job.mode).inc()
        self.metrics.summary_input_events.inc(len(delta))
        if covered_tokens:
            self.metrics.summary_compression.observe(summary_tokens / covered_tokens)
        log.info("checkpoint created", extra={"fields": {"session": job.ref.key, "checkpoint": cp.id, "covered_events": end,
                                                         "mode": job.mode, "deterministic": model == DETERMINISTIC_MODEL}})
        return cp
