"""The Grafana dashboard queries only what the gateway exports, and label sets stay bounded.

Every PromQL expression of every panel (and of the template variables) is parsed for metric
names; each must be a series of a family the running gateway exports on /metrics, with the
suffix its type implies (counters ``_total``, histograms ``_bucket``/``_sum``/``_count``,
gauges bare). A labelled family with no children yet still has its ``# HELP``/``# TYPE``
lines, so the check holds before every code path has run.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.metrics import MODEL_LABEL_CAP
from gateway.keys import METRICS
from simulator.workloads import synthetic_session
from tests.support.agent import drive

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "palimpsest-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# Label names a gateway may export: none of them carries a session, tenant or free-form string.
BOUNDED_LABELS = {"route", "model", "status", "kind", "purpose", "pass", "mode", "reason", "tool", "outcome", "component", "le", "caller",
                  "upstream", "arm", "side", "what"}  # upstream: the configured upstreams' names
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels") or [])  # collapsed rows keep their panels inside
    return out


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in all_panels(dashboard) for t in p.get("targets") or [] if t.get("expr")]


def variable_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(variable name, metric) for label_values(metric, label) template variables."""
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        found = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)\s*", query)
        assert found, f"variable {var['name']}: unsupported query {query!r}"
        out.append((var["name"], found.group(1)))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: what is left once strings, label matchers, ranges,
    grouping clauses, Grafana variables, functions and keywords are taken away."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", s):
        if m.group() in PROMQL_KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def exported_series(families: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Series name -> (family, type) for families as exposed: {family name: type}."""
    out = {}
    for family, kind in families.items():
        for suffix in SUFFIXES.get(kind, ("",)):
            out[family + suffix] = (family, kind)
    return out


def registry_families(app) -> dict[str, str]:
    return {f.name: f.type for f in app[METRICS].registry.collect()}


async def scrape(gw) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + "/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            return await r.text()


def test_dashboard_is_importable_grafana_json():
    d = load_dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    assert d["__inputs"][0]["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [p for p in all_panels(d) if p["type"] != "row"]
    assert len({p["id"] for p in all_panels(d)}) == len(all_panels(d)), "panel ids must be unique"
    assert len(panels) >= 25
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS_PROMETHEUS}"
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
    # Expressions are balanced and filtered by the template variables where they apply.
    for title, expr in panel_queries(d):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), (title, expr)
        assert "$__interval" not in expr, "rate windows use $__rate_interval (robust to scrape interval)"


def test_every_query_names_palimpsest_metrics_with_their_types():
    d = load_dashboard()
    from gateway.ops.metrics import Metrics

    series = exported_series({f.name: f.type for f in Metrics().registry.collect()})
    for title, expr in panel_queries(d):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        for name in names:
            assert name.startswith("palimpsest_"), f"{title}: {name} is not a gateway metric"
            assert name in series, f"{title}: {name} is not exported (typo, or a counter without _total?)"
            family, kind = series[name]
            if kind == "gauge":
                assert not re.search(rf"\b(rate|irate|increase)\(\s*{name}\b", expr), f"{title}: rate() over gauge {name}"
            if kind == "counter":
                assert re.search(rf"\b(rate|irate|increase)\(\s*{name}\b", expr), f"{title}: counter {name} used raw"
        for q in re.finditer(r"histogram_quantile\(\s*[\d.]+\s*,[^()]*\((?:[^()]*\()?\s*(palimpsest_\w+)", expr):
            assert q.group(1).endswith("_bucket"), f"{title}: histogram_quantile over {q.group(1)}"


async def test_every_dashboard_metric_is_exported(gateway, upstream):
    d = load_dashboard()
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="sk-dash", max_retries=0,
                                default_headers={"X-Session-Id": "dash"})
    async with client:
        await drive(client, synthetic_session(seed=11, rounds=3), model="fake-32k")
        await client.models.list()  # the pass-through route
    text = await scrape(gateway)
    registered = registry_families(gateway.app)
    # The text parser reads prometheus_client's "<counter>_created" timestamps as families of their own.
    exposed = {f.name: f.type for f in text_string_to_metric_families(text)
               if not (f.name.endswith("_created") and f.name.removesuffix("_created") in registered)}
    # What the HTTP endpoint shows is what the registry holds: no family hidden for lack of samples.
    assert exposed == registered
    series = exported_series(exposed)
    referenced = {name for _, expr in panel_queries(d) for name in metric_names(expr)}
    referenced |= {metric for _, metric in variable_queries(d)}
    missing = sorted(referenced - series.keys())
    assert not missing, f"dashboard queries metrics the gateway does not export: {missing}"
    # The traffic just driven shows up as samples, under the names the dashboard uses.
    samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for name in ("palimpsest_requests_total", "palimpsest_request_duration_seconds_bucket",
                 "palimpsest_gateway_overhead_seconds_bucket", "palimpsest_upstream_duration_seconds_bucket",
                 "palimpsest_client_prompt_tokens_total", "palimpsest_upstream_prompt_tokens_total",
                 "palimpsest_tokens_saved_total", "palimpsest_store_bytes"):
        assert name in samples and name in referenced, name
    # And every family the gateway exports is on the dashboard somewhere.
    shown = {series[name][0] for name in referenced}
    assert shown == set(exposed), f"exported but not on the dashboard: {sorted(set(exposed) - shown)}"


async def test_series_the_net_panels_subtract_exist_before_any_summary_or_recall(gateway):
    """The net-savings panels subtract ``overhead_tokens_total``; with no series of it (no summary
    or recall call yet) PromQL's subtraction is empty and the panels show no data at all. The
    same for the summary-job rates: a series first seen in the last scrape has no rate."""
    samples = {(s.name, s.labels.get("purpose")): s.value
               for f in text_string_to_metric_families(await scrape(gateway)) for s in f.samples}
    assert samples[("palimpsest_overhead_tokens_total", "summary")] == 0
    assert samples[("palimpsest_overhead_tokens_total", "recall")] == 0
    modes = {(s.name, s.labels.get("mode")): s.value
             for f in text_string_to_metric_families(await scrape(gateway)) for s in f.samples}
    for mode in ("async", "sync", "client"):  # the "Summary jobs" panel's rates, 0 before any job
        assert modes[("palimpsest_summary_jobs_enqueued_total", mode)] == 0
        assert modes[("palimpsest_summary_checkpoints_created_total", mode)] == 0
    subtracting = [expr for _, expr in panel_queries(load_dashboard())
                   if re.search(r"\) - sum\((increase|rate)\(palimpsest_overhead_tokens_total", expr)]
    assert len(subtracting) == 4, subtracting


async def test_label_sets_are_bounded(start_gateway, upstream):
    configured = {"fake-32k": {"context_window": 32_000}, "fake-8k": {"context_window": 8_000}}
    gw = await start_gateway(models=configured)
    extra = 15
    models = [f"client-model-{i}" for i in range(MODEL_LABEL_CAP + extra)]

    async def ask(s: aiohttp.ClientSession, model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
        async with s.post(gw.base_url + "/chat/completions", json=body, headers={"X-Session-Id": f"s-{model}"}) as r:
            assert r.status == 200, await r.text()

    async with aiohttp.ClientSession() as s:
        for batch in range(0, len(models), 10):
            await asyncio.gather(*(ask(s, m) for m in models[batch : batch + 10]))
        await ask(s, "fake-32k")  # configured models always keep their own label
    text = await scrape(gw)
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                values.setdefault(label, set()).add(value)
    assert set(values) <= BOUNDED_LABELS, f"unexpected label names: {set(values) - BOUNDED_LABELS}"
    assert values["arm"] <= {"holdout", "compacted"} and values["side"] <= {"client", "upstream"}
    # At most the cap of client-chosen names, the configured ones, "other" and "none".
    assert len(values["model"]) <= MODEL_LABEL_CAP + len(configured) + 2
    assert "other" in values["model"] and "fake-32k" in values["model"]
    assert values["upstream"] == {"default"}  # the configured upstreams only, whatever the model
    assert not {f"client-model-{i}" for i in range(MODEL_LABEL_CAP + 2, MODEL_LABEL_CAP + extra)} & values["model"]
    assert values["route"] <= {"chat", "passthrough"}
    assert values["caller"] <= {"client", "recall", "summary"}
    assert all(re.fullmatch(r"\d{3}", status) for status in values["status"])
    # Sessions never become labels: none of the 65 session ids appears anywhere in the output.
    assert "s-client-model" not in text
