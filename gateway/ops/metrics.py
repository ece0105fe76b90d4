"""Prometheus metrics, prefix ``palimpsest_``, base units (seconds, bytes, tokens as counters).

Each app has its own registry (no module globals), so tests can run several gateways in one
process. Label values are bounded and never a client's free text: a model is its own label when
it is configured or the upstream has answered a request for it (up to ``MODEL_LABEL_CAP``),
everything else is ``other`` (a model name can be anything, a pasted key included); routes are
the gateway's own route names, upstreams the configured ones' names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.ops.costs import Costs

MODEL_LABEL_CAP = 50
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
RATIO_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
ROUND_BUCKETS = (0, 1, 2, 3, 4, 5, 8)


class Children:
    """A labelled metric whose children are kept in a dict by their label values: prometheus
    client's ``labels()`` validates the values and takes a lock on every call, and a request
    makes a dozen or more of them. Label values are bounded (see above), so is the dict.
    Everything but ``labels`` is the metric's own."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric: MetricWrapperBase) -> None:
        self._metric = metric
        self._children: dict[tuple, MetricWrapperBase] = {}

    def labels(self, *values, **named):
        if named:
            return self._metric.labels(*values, **named)
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child

    def __getattr__(self, name: str):
        return getattr(self._metric, name)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, known_models: list[str] | None = None, prices: dict[str, dict] | None = None) -> None:
        # *_created series double the series count and carry nothing a dashboard uses.
        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._models: set[str] = set(known_models or [])
        self._model_cap = MODEL_LABEL_CAP + len(self._models)
        p = "palimpsest_"
        # Requests and latency.
        self.requests = Counter(p + "requests_total", "Requests handled, by the upstream that served them ([upstream] is 'default').",
                                ["route", "model", "status", "upstream"], registry=r)
        self.request_seconds = Histogram(p + "request_duration_seconds", "Wall time of a request.", ["route", "model"], buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_seconds = Histogram(p + "upstream_duration_seconds", "Time waiting on the upstream per request.", ["route", "model", "upstream"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead_seconds = Histogram(p + "gateway_overhead_seconds", "Request time not spent waiting on the upstream.", ["route"], buckets=OVERHEAD_BUCKETS, registry=r)
        self.in_flight = Gauge(p + "requests_in_flight", "Requests being handled.", registry=r)
        self.upstream_errors = Counter(p + "upstream_errors_total", "Upstream failures by kind (status code, unreachable, timeout).", ["kind"], registry=r)
        self.incomplete_answers = Counter(p + "incomplete_answers_total", "Streams that failed after they started (answer not recorded), by kind.", ["kind"], registry=r)
        # Tokens.
        self.client_prompt_tokens = Counter(p + "client_prompt_tokens_total", "Prompt tokens the client sent (estimated).", ["model"], registry=r)
        self.upstream_prompt_tokens = Counter(p + "upstream_prompt_tokens_total", "Prompt tokens sent upstream (estimated, calibrated).", ["model"], registry=r)
        self.upstream_usage_prompt_tokens = Counter(p + "upstream_usage_prompt_tokens_total", "Prompt tokens the upstream reported in usage.", ["model"], registry=r)
        self.upstream_usage_cached_tokens = Counter(p + "upstream_usage_cached_tokens_total", "Cached prompt tokens the upstream reported.", ["model"], registry=r)
        self.upstream_usage_completion_tokens = Counter(p + "upstream_usage_completion_tokens_total", "Completion tokens the upstream reported.", ["model"], registry=r)
        self.tokens_saved = Counter(p + "tokens_saved_total", "Prompt tokens not sent upstream (client minus upstream).", ["model"], registry=r)
        self.tokens_spent_overhead = Counter(p + "overhead_tokens_total", "Tokens the gateway spent itself (summary and recall calls).", ["purpose"], registry=r)
        # Compaction and tailoring.
        self.compaction_replacements = Counter(p + "compaction_replacements_total", "Tool results replaced or truncated in the outgoing copy.", ["pass"], registry=r)
        self.tailoring_drops = Counter(p + "tailoring_dropped_messages_total", "Messages dropped or truncated by tailoring.", ["kind"], registry=r)
        self.context_rejections = Counter(p + "context_length_rejections_total", "Requests answered 400 because nothing could fit.", registry=r)
        self.truncated_tool_results = Counter(p + "truncated_tool_results_total", "Tool results cut head/tail in the outgoing copy (over max_result_tokens or to fit the window).", registry=r)
        self.truncated_last_messages = Counter(p + "truncated_last_messages_total", "Newest user messages cut to fit the window (policy truncate_last_message).", registry=r)
        # Summary jobs.
        self.summary_enqueued = Counter(p + "summary_jobs_enqueued_total", "Summary jobs enqueued.", ["mode"], registry=r)
        self.summary_dropped = Counter(p + "summary_jobs_dropped_total", "Summary jobs dropped (queue full or duplicate).", ["reason"], registry=r)
        self.summary_created = Counter(p + "summary_checkpoints_created_total", "Checkpoints created.", ["mode"], registry=r)
        self.summary_errors = Counter(p + "summary_errors_total", "Summary jobs that failed.", ["reason"], registry=r)
        self.summary_invalid = Counter(p + "summary_invalid_format_total", "Summaries rejected by validation.", registry=r)
        self.summary_transcript_cheaper = Counter(p + "summary_transcript_cheaper_total", "Summary calls sent as a "
                                                  "transcript where a cache fork applied: by the model's cache rule, "
                                                  "re-reading the view would have cost more.", registry=r)
        self.summary_checks = Counter(p + "summary_checks_total", "New checkpoints checked before replacing the old one: "
                                      "passed, repaired or refused (the old one stays).", ["outcome"], registry=r)
        self.summary_check_problems = Counter(p + "summary_check_problems_total", "What checked checkpoints lost or "
                                              "invented: values, rules (standing instructions), invented (instructions "
                                              "the user never gave).", ["problem"], registry=r)
        self.summary_seconds = Histogram(p + "summary_duration_seconds", "Summary job wall time.", ["mode"], buckets=LATENCY_BUCKETS, registry=r)
        self.summary_llm_seconds = Histogram(p + "summary_llm_duration_seconds", "Summary model call latency.", buckets=LATENCY_BUCKETS, registry=r)
        self.summary_input_tokens = Counter(p + "summary_input_tokens_total", "Prompt tokens of summary calls (upstream usage).", registry=r)
        self.summary_output_tokens = Counter(p + "summary_output_tokens_total", "Completion tokens of summary calls.", registry=r)
        self.summary_cache_read_tokens = Counter(p + "summary_cache_read_tokens_total", "Cached prompt tokens of summary calls.", registry=r)
        self.summary_input_events = Counter(p + "summary_input_events_total", "Events folded into summaries.", registry=r)
        self.summary_compression = Histogram(p + "summary_compression_ratio", "Summary tokens / covered tokens.", buckets=RATIO_BUCKETS, registry=r)
        self.summary_queue_depth = Gauge(p + "summary_queue_depth", "Summary jobs waiting.", registry=r)
        self.summary_skipped = Counter(p + "summary_jobs_skipped_total", "Summary jobs not started: session backing off, breaker open, Retry-After, or an arrival the cost model defers.", ["reason"], registry=r)
        self.summary_calls = Counter(p + "summary_calls_total", "Summary model calls by outcome.", ["outcome"], registry=r)
        self.summary_breaker_transitions = Counter(p + "summary_breaker_transitions_total", "Summary model circuit breaker transitions.", ["kind"], registry=r)
        self.summary_breakers_open = Gauge(p + "summary_breakers_open", "Summary models whose circuit breaker is open or half-open.", registry=r)
        self.summary_deterministic = Counter(p + "summary_deterministic_checkpoints_total", "Checkpoints written without a model (degraded mode).", ["mode"], registry=r)
        self.tenant_budget_tokens = Counter(p + "tenant_budget_tokens_total", "Tokens the gateway spent on tenants' behalf, by kind of call.", ["kind"], registry=r)
        self.tenant_budget_exceeded = Counter(p + "tenant_budget_exceeded_total", "Gateway calls skipped: the tenant's token budget was spent.", ["kind"], registry=r)
        self.sync_wait_seconds = Histogram(p + "sync_compaction_wait_seconds", "Time a request waited for sync compaction.", buckets=LATENCY_BUCKETS, registry=r)
        # Recall.
        self.recall_calls = Counter(p + "recall_calls_total", "Recall tool calls resolved by the gateway.", ["tool", "outcome"], registry=r)
        self.recall_rounds = Histogram(p + "recall_rounds", "Recall rounds per turn.", buckets=ROUND_BUCKETS, registry=r)
        self.recall_seconds = Histogram(p + "recall_duration_seconds", "Recall tool execution time.", ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.recall_hits = Histogram(p + "recall_search_hits", "Results returned per search.", buckets=(0, 1, 2, 3, 5, 10, 20), registry=r)
        # Store.
        self.store_bytes = Gauge(p + "store_bytes", "Bytes on disk by store component.", ["component"], registry=r)
        self.store_sessions = Gauge(p + "store_sessions", "Sessions in the ledger.", registry=r)
        self.ledger_events = Counter(p + "ledger_events_appended_total", "Events appended to the ledger.", ["kind"], registry=r)
        self.store_write_errors = Counter(p + "store_write_errors_total", "Best-effort ledger writes that failed (answer, recall_side_events).", ["what"], registry=r)
        self.bypassed = Counter(p + "bypassed_requests_total", "Requests sent upstream untouched (x-palimpsest-bypass, "
                                "[tenants.NAME] bypass), by route and reason (header, tenant).", ["route", "reason"], registry=r)
        # Billed tokens and money, by caller, and the direct counterfactual (gateway/ops/costs.py).
        self.costs = Costs(r, prices)
        # The holdout (policies/holdout.py): the same figures per arm, holdout (sent as direct) or compacted.
        self.arm_requests = Counter(p + "arm_requests_total", "Requests by holdout arm and status.", ["arm", "status"], registry=r)
        self.arm_prompt_tokens = Counter(p + "arm_prompt_tokens_total", "Prompt tokens by arm: what the client sent "
                                         "(side=client) and what went upstream (side=upstream, estimated).", ["arm", "side"], registry=r)
        self.arm_billed_units = Counter(p + "arm_billed_units_total", "Every upstream call by arm, priced in uncached input "
                                        "tokens by the model's cache rule (what=billed; summary calls count to compacted), and "
                                        "the client's requests sent direct with the provider's cache (what=direct).", ["arm", "what"], registry=r)
        self.arm_cost = Counter(p + "arm_cost_usd_total", "Billed and direct cost by arm, US dollars (models with a known price).",
                                ["arm", "what"], registry=r)
        self.arm_recall_calls = Counter(p + "arm_recall_calls_total", "Recall tool calls resolved by the gateway, by arm.", ["arm"], registry=r)
        self.arm_rejections = Counter(p + "arm_context_rejections_total", "Requests refused 400 context_length_exceeded, by arm.",
                                      ["arm"], registry=r)
        for name, metric in list(vars(self).items()):
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                setattr(self, name, Children(metric))
        # Series the dashboard subtracts or rates exist from the first scrape: a gateway that has
        # made no summary or recall call yet shows its net savings (0 spent) and 0 summary jobs/s,
        # not "no data" (and a series first seen late has no earlier sample for rate/increase).
        for purpose in ("summary", "recall"):
            self.tokens_spent_overhead.labels(purpose)
        for mode in ("async", "sync", "client"):
            self.summary_enqueued.labels(mode)
            self.summary_created.labels(mode)

    def arm_billed(self, arm: str, model: str, billed, what: str = "billed", output_rate: float = 4.0) -> None:
        """One request's (or summary call's) tokens, priced, into its arm's counters."""
        rule = self.costs.rule(model)
        self.arm_billed_units.labels(arm, what).inc(
            billed.uncached + rule.read * billed.cached + rule.write * (billed.cache_write - billed.cache_write_1h)
            + rule.write_1h * billed.cache_write_1h + output_rate * billed.output)
        price = self.costs.price(model)
        if price is not None:
            self.arm_cost.labels(arm, what).inc(price.cost(billed))

    def model_label(self, model: str | None) -> str:
        if not model:
            return "none"
        return model if model in self._models else "other"

    def model_answered(self, model: str) -> None:
        """The upstream answered a request for `model`: it may be a label from now on."""
        if model not in self._models and len(self._models) < self._model_cap and len(model) <= 64:
            self._models.add(model)

    def upstream_error(self, status: int | None = None, kind: str | None = None) -> None:
        """Count an upstream failure: its HTTP status class, or 'unreachable' / 'timeout'."""
        self.upstream_errors.labels(kind or str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
