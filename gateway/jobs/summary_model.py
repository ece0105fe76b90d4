"""The summary model, called: chunked folds, map-reduce, validation, one informed retry.

``SummaryModel.write`` turns the previous summary and a delta into a new summary or raises
``SummaryFailed`` (``SummaryRejected`` when the model answered off-format). Every call's outcome
goes to ``outcome`` (the summarizer's per-model breaker and metrics); rejections are counted on
the session's backoff state, which decides whether a retry is still worth a call. Summary calls
carry the tenant's own key for the session's upstream, else the upstream's key, else the
client's own credential (``Authorization`` or Azure-style ``api-key``), unless a summary key is
configured. They go to the upstream of the session's model, in its format (``route``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import orjson

from gateway.http.routing import Upstreams
from gateway.http.upstream import Upstream
from gateway.jobs.backoff import Breaker, SessionBackoff, retry_after_seconds
from gateway.jobs.budget import TenantBudget
from gateway.pipeline.fork import SummaryFork
from gateway.pipeline.offload import pure as off_loop
from policies import (
    Policy,
    TokenCounter,
    chunk_messages,
    extract_exact_values,
    format_transcript,
    render_fork_instruction,
    render_summary_request,
    validate_summary,
)
from policies.messages import content_text
from policies.holdout import COMPACTED
from policies.cost import cost_rates, fork_pays
from policies.prices import read_usage
from policies.summary import has_secret, render_correction_request
from store.records import SessionRef

log = logging.getLogger("palimpsest.summary")
# Tokens a summary request needs besides the transcript: instruction, previous summary, values.
SUMMARY_PROMPT_ROOM = 4000
VALIDATED_VALUES = 12
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")
ANTHROPIC_VERSION = "2023-06-01"
# Statuses a provider gives for what one request carries (its content or size), not for the
# model's health: they fail that session's job, never every tenant's (the shared breaker).
CONTENT_STATUSES = frozenset({400, 413, 422})

Auth = Mapping[str, str] | str | None


def credential_headers(auth: Auth) -> dict[str, str]:
    """The client's credential as request headers: ``Authorization``, Azure-style ``api-key`` or
    Anthropic's ``x-api-key`` (a bare string is an Authorization value)."""
    if not auth:
        return {}
    if isinstance(auth, str):
        return {"Authorization": auth}
    return {k: v for k, v in auth.items() if k.lower() in CREDENTIAL_HEADERS and v}


def fork_applies(turn) -> bool:
    """Could a summary after this turn be a cache fork of its view? Not where the format has no
    fork for it (``turn.peer``), with another summary model or endpoint (no shared cache), a view
    tailoring cut (the fork would not see the whole delta), legacy functions, or no room in the
    window for the instruction and the summary."""
    view, chat, policy = turn.view, turn.chat, turn.view.policy
    if turn.peer is None:
        return False
    if not policy.summary_cache_fork or policy.summary_base_url or (policy.summary_model and policy.summary_model != chat.model):
        return False
    if view.dropped or chat.body.get("functions"):
        return False
    return not (view.window and view.upstream_tokens + SUMMARY_PROMPT_ROOM + 2 * policy.summary_max_words > view.window)


def fork_parent(turn, answer: dict) -> SummaryFork | None:
    """The format's fork of the view the upstream just got (its cached prefix) with the answer;
    None where no fork applies."""
    view, chat, policy = turn.view, turn.chat, turn.view.policy
    if not fork_applies(turn):
        return None
    # The transcript form redacts secrets before the summary model reads them; a fork cannot
    # (it must resend the prefix byte for byte), so a view holding one is summarised as a transcript.
    shown = view.messages if view.messages is not None else [*chat.instructions, *chat.history]
    if policy.redact_patterns and has_secret([*shown, answer], policy.redact_patterns):
        return None
    return turn.peer.fork(turn, answer)


class SummaryFailed(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class BudgetExceeded(SummaryFailed):
    """The tenant's token budget cannot cover the call (``gateway.jobs.budget``): not made."""

    def __init__(self) -> None:
        super().__init__("tenant_budget")


class SummaryRejected(SummaryFailed):
    """The model answered, but the summary failed validation."""

    def __init__(self) -> None:
        super().__init__("invalid_format")


@dataclass(slots=True)
class SummaryJob:
    ref: SessionRef
    model: str
    policy: Policy
    history: list[dict]  # the path's messages (answer included), no system messages
    ids: list[str]
    auth: Auth  # the client's credential headers, in memory only, for upstreams that need them
    fork: SummaryFork | None = None  # the request just sent upstream, in its format: a cache fork's prefix
    mode: str = "async"
    budget: int = 0  # the request model's prompt budget: scales the raw tail kept after the boundary
    deterministic: bool = False  # degraded: write the state-only checkpoint, call no model
    probe: Breaker | None = None  # the half-open breaker this job probes
    fell_back: bool = False  # the model was rejected and the job wrote a deterministic checkpoint


class SummaryModel:
    def __init__(self, *, upstream: Upstreams, windows, counter: TokenCounter, metrics, backoff: SessionBackoff,
                 outcome: Callable[..., None], budget: TenantBudget | None = None) -> None:
        self.upstream = upstream
        self.budget = budget or TenantBudget(0)
        self.windows = windows
        self.counter = counter
        self.metrics = metrics
        self.backoff = backoff
        self.outcome = outcome
        # Seconds per summary call, learnt; decides whether a sync fold can finish in time.
        self.call_seconds = 3.0

    async def chunk_tokens(self, job: SummaryJob) -> int:
        """Transcript tokens per summary call: the policy's, but never more than the summary
        model's window holds next to the prompt, the previous summary and the answer."""
        policy = job.policy
        window = await self.windows.window(self.route(job)[1], job.auth) if self.windows else 10**9
        room = window - 2 * policy.summary_max_words - SUMMARY_PROMPT_ROOM
        return max(1000, min(policy.summary_chunk_tokens, room))

    async def write(self, job: SummaryJob, summary: str | None, delta: list[dict], state: dict) -> str | None:
        """`summary` updated with `delta`: in one cache-forked call when that form is the
        cheaper (``fork_costs_less``), else folded chunk by chunk, or map-reduced when big."""
        chunks = chunk_messages(delta, await self.chunk_tokens(job), self.counter)
        if job.policy.summary_cache_fork and job.fork is not None:
            if await off_loop(self.fork_costs_less, delta, job, summary, chunks):
                try:
                    return await self.fork(job, summary, delta)
                except SummaryFailed as exc:
                    if not exc.reason.startswith("upstream_4") or exc.reason == "upstream_429":
                        raise
                    # The provider refused the fork's shape (tool_choice, a message order): the
                    # transcript form asks the same of it.
            else:
                self.metrics.summary_transcript_cheaper.inc()
        if len(chunks) > 1 and job.policy.summary_parallel > 1:
            return await self.map_reduce(job, summary, chunks, state)
        for chunk in chunks:
            summary = await self.fold(job, summary, chunk)
        return summary

    def fork_costs_less(self, delta: list[dict], job: SummaryJob, summary: str | None, chunks: list[list[dict]]) -> bool:
        """Price both forms of the call by the model's cache rule (``policies.cost.fork_pays``):
        the fork re-reads the view at the read rate and pays the answer and its instruction
        uncached; the transcript form pays its requests (one per chunk) uncached."""
        policy = job.policy
        state = extract_exact_values(delta, cap=VALIDATED_VALUES * 4)
        added = self.counter.count_text(render_fork_instruction(summary, state, policy))
        if job.history:
            added += self.counter.count_message(job.history[-1], job.ids[-1] if job.ids else None)  # the answer
        transcript = sum(self.counter.count_messages(render_summary_request(
            summary, extract_exact_values(c, cap=VALIDATED_VALUES * 4), format_transcript(c, policy), policy))
            for c in chunks)
        upstream, _ = self.route(job)
        # Anthropic caches only at breakpoints, and the transcript form sets none: no write.
        written = getattr(upstream, "format", "openai") != "anthropic"
        return fork_pays(job.fork.tokens, added, transcript, cost_rates(policy), written=written)

    async def fold(self, job: SummaryJob, summary: str | None, chunk: list[dict]) -> str:
        """`summary` updated with one chunk of the delta."""
        policy = job.policy
        # The summary is asked to keep the chunk's own values (the structured state carries
        # every value of the session beside it anyway), and validation checks the first few
        # of each kind: a 60-round delta can name hundreds of paths.
        chunk_state = extract_exact_values(chunk, cap=VALIDATED_VALUES * 4)
        checked = {kind: values[:VALIDATED_VALUES] for kind, values in chunk_state.items()}
        messages = render_summary_request(summary, chunk_state, format_transcript(chunk, policy), policy)
        return await self.summarize(job, messages, checked)

    async def fork(self, job: SummaryJob, summary: str | None, delta: list[dict]) -> str:
        """`summary` updated with `delta` in one call that resends the view just sent (which
        holds the delta) plus the instruction: the provider serves the prefix from its cache.
        The messages summarised here are only what the call adds to the fork."""
        state = extract_exact_values(delta, cap=VALIDATED_VALUES * 4)
        checked = {kind: values[:VALIDATED_VALUES] for kind, values in state.items()}
        messages = [{"role": "user", "content": render_fork_instruction(summary, state, job.policy)}]
        return await self.summarize(job, messages, checked, forked=True)

    async def map_reduce(self, job: SummaryJob, previous: str | None, chunks: list[list[dict]], state: dict) -> str:
        """Summarise the chunks at once (at most summary_parallel calls in flight), then merge
        the part summaries into the previous summary with one more call. One failing part
        cancels its siblings and waits for them: nothing keeps running unobserved."""
        gate = asyncio.Semaphore(job.policy.summary_parallel)

        async def part(chunk: list[dict]) -> str:
            async with gate:
                return await self.fold(job, None, chunk)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(part(c), name=f"summary-part-{i}") for i, c in enumerate(chunks)]
        except BaseExceptionGroup as failed:
            raise _first_failure(failed) from None
        parts = [t.result() for t in tasks]
        transcript = "\n\n".join(f"[summary of part {i + 1} of {len(parts)}, in order]\n{text}" for i, text in enumerate(parts))
        checked = {kind: values[:VALIDATED_VALUES] for kind, values in state.items()}
        merged_state = {kind: values[: VALIDATED_VALUES * 4] for kind, values in state.items()}
        messages = render_summary_request(previous, merged_state, transcript, job.policy)
        return await self.summarize(job, messages, checked)

    async def summarize(self, job: SummaryJob, messages: list[dict], checked: dict, *, forked: bool = False) -> str:
        """One call; a rejected answer gets one retry that names the problems, unless the
        session already has a rejection history (then it is not worth a second call)."""
        for attempt in range(2):
            text = await self.call(job, messages, forked=forked)
            problems = validate_summary(text, checked, job.policy, self.counter.count_text(text or ""))
            if not problems:
                self.outcome(job, True, "ok")
                return text
            self.outcome(job, False, "rejected", cause="rejected")
            self.metrics.summary_invalid.inc()
            rejections = self.backoff.rejected(job.ref.key)
            # Problems name sections and counts, never summary text.
            log.warning("summary rejected", extra={"fields": {"session": job.ref.key, "problems": problems, "rejections": rejections}})
            if attempt or self.backoff.degraded(job.ref.key):
                break
            messages = render_correction_request(messages, problems)
        raise SummaryRejected()

    def route(self, job: SummaryJob) -> tuple[Upstream, str]:
        """The upstream of the session's model and the model that writes its summary there: the
        upstream's ``summary_model``, else the policy's when the same upstream serves it, else
        the session's own model (a summary never goes to another provider)."""
        upstreams = self.upstream
        upstream = upstreams.for_model(job.model)
        wanted = job.policy.summary_model
        if upstream.summary_model:
            return upstream, upstream.summary_model
        if wanted and (job.policy.summary_base_url or upstreams.for_model(wanted) is upstream):
            return upstream, wanted
        return upstream, job.model

    def _key(self, job: SummaryJob, upstream: Upstream) -> str | None:
        policy = job.policy
        if policy.summary_api_key or policy.summary_base_url:
            return policy.summary_api_key
        return self.upstream.tenant_key(job.ref.tenant, upstream) or upstream.api_key

    async def call(self, job: SummaryJob, messages: list[dict], *, forked: bool = False) -> str:
        """One summary call. A fork (`forked`) speaks its parent's format on its route, and
        `messages` are what it appends; otherwise they are the whole request, in the upstream's
        format (Chat Completions, or Anthropic Messages for ``upstream.format = "anthropic"``)."""
        policy = job.policy
        upstream, model = self.route(job)
        base = (policy.summary_base_url or upstream.base_url).rstrip("/")
        headers = {"Content-Type": "application/json", "x-palimpsest-purpose": "summary"}
        key = self._key(job, upstream)
        max_tokens = policy.summary_max_words * 2
        fork = job.fork if forked else None
        if fork is not None:
            key_header = fork.key_header
            path, body, read = fork.path, fork.body([content_text(m["content"]) for m in messages], max_tokens), fork.reply
            headers.update(fork.headers)
            reserved = fork.tokens + self.counter.count_messages(messages) + body.get("max_tokens", body.get("max_output_tokens", max_tokens))
        else:
            anthropic = getattr(upstream, "format", "openai") == "anthropic"
            key_header = "x-api-key" if anthropic else "Authorization"
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
            path, read = "/chat/completions", chat_reply
            if anthropic:  # the same request in Anthropic Messages: system text apart, the answer in content blocks
                headers["anthropic-version"] = ANTHROPIC_VERSION
                path, body, read = "/messages", messages_body(body), messages_reply
            reserved = self.counter.count_messages(messages) + max_tokens
        if key:
            headers.update({"x-api-key": key} if key_header == "x-api-key" else {"Authorization": f"Bearer {key}"})
        elif job.auth:
            headers.update(credential_headers(job.auth))
        if not self.budget.reserve(job.ref.tenant, reserved):
            raise BudgetExceeded()
        spent = reserved  # a call that ends without usage is charged its estimate
        try:
            text, used = await self._send(job, upstream, base + path, headers, body, read)
            spent = used or reserved
            return text
        finally:
            self.budget.settle(job.ref.tenant, reserved, spent)

    async def _send(self, job: SummaryJob, upstream: Upstream, url: str, headers: dict, body: dict, read) -> tuple[str, int]:
        """The summary text and the tokens the upstream reported (prompt + completion)."""
        started = time.perf_counter()
        try:
            async with upstream.request(upstream.api, "POST", url, data=orjson.dumps(body), headers=headers) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    wait = retry_after_seconds(resp.headers) if resp.status in (429, 503) else None
                    cause = "content" if resp.status in CONTENT_STATUSES else "unavailable"
                    self.outcome(job, False, "rate_limited" if resp.status == 429 else "error", retry_after=wait, cause=cause)
                    raise SummaryFailed(f"upstream_{resp.status}", wait)
        except SummaryFailed:
            raise
        except Exception as exc:
            self.outcome(job, False, "error")
            raise SummaryFailed("upstream_unreachable") from exc
        elapsed = time.perf_counter() - started
        self.call_seconds = 0.7 * self.call_seconds + 0.3 * elapsed
        self.metrics.summary_llm_seconds.observe(elapsed)
        try:
            data = orjson.loads(payload)
            text, usage = read(data)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            self.outcome(job, False, "error")
            raise SummaryFailed("bad_response") from None
        billed = read_usage(usage)  # every API's usage fields (policies/prices.py)
        self.metrics.summary_input_tokens.inc(billed.prompt)
        self.metrics.summary_output_tokens.inc(billed.output)
        self.metrics.summary_cache_read_tokens.inc(billed.cached)
        self.metrics.tokens_spent_overhead.labels("summary").inc(billed.prompt + billed.output)
        self.metrics.costs.call(body["model"], self.metrics.model_label(body["model"]), "summary", usage)
        self.metrics.arm_billed(COMPACTED, body["model"], billed, "billed", job.policy.output_rate)
        return text or "", billed.prompt + billed.output


def chat_reply(data: dict) -> tuple[str, dict | None]:
    """A chat completion's text and usage."""
    return data["choices"][0]["message"]["content"] or "", data.get("usage")


def messages_reply(data: dict) -> tuple[str, dict | None]:
    """An Anthropic message's text and usage."""
    text = "".join(b.get("text") or "" for b in data["content"] if isinstance(b, dict) and b.get("type") == "text")
    return text, data.get("usage")


def messages_body(chat: dict) -> dict:
    """A chat completion request for a summary as an Anthropic Messages request: the system
    messages become ``system``, the rest alternate as user/assistant text."""
    system = "\n\n".join(content_text(m.get("content")) for m in chat["messages"] if m.get("role") in ("system", "developer"))
    turns: list[dict] = []
    for m in chat["messages"]:
        if m.get("role") in ("system", "developer"):
            continue
        role = "assistant" if m.get("role") == "assistant" else "user"
        text = content_text(m.get("content")) or "(no text)"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + text
        else:
            turns.append({"role": role, "content": text})
    body = {"model": chat["model"], "max_tokens": chat["max_tokens"], "temperature": chat["temperature"], "messages": turns}
    if system:
        body["system"] = system
    return body


def _first_failure(group: BaseExceptionGroup) -> BaseException:
    """The exception a failed part raised (its siblings' cancellations are not failures)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_failure(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group.exceptions[0]
