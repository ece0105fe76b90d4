"""A real Prometheus scrapes a running gateway under a replayed workload.

The gateway runs in this process on a loopback port in front of the puppet; Prometheus (the
Debian package's binary) runs as a child process scraping it every second. After a long
synthetic session on a 32k model (compaction and summaries kick in), the test asks
Prometheus's HTTP API for the savings and latency series, and evaluates every expression of the
Grafana dashboard on the real PromQL engine.

Without the binary the test skips, except under CI (``CI`` set), where it fails: CI must not
silently skip it.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import socket
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.keys import METRICS
from simulator.workloads import synthetic_session
from tests.ops.test_dashboard import load_dashboard, panel_queries
from tests.support.agent import drive

DEADLINE_S = 55  # every wait of the test together stays under a minute
# Grafana's variables, as a panel would expand them with "All" selected.
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__range": "5m", "$model": ".*", "$route": ".*"}


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("CI is set but the prometheus binary is missing (Debian package 'prometheus').")
    pytest.skip("prometheus binary not found; install the Debian package 'prometheus' to run this test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, binary: str, root: Path, target: str) -> None:
        self.binary = binary
        self.root = root
        self.target = target
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc: asyncio.subprocess.Process | None = None
        self.log = root / "prometheus.log"

    async def start(self, deadline: float) -> None:
        config = self.root / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: palimpsest\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{self.target}']\n"
        )
        with self.log.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn",
                stdout=log, stderr=log,
            )
        async with aiohttp.ClientSession() as s:
            while True:
                if self.proc.returncode is not None:
                    pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
                try:
                    async with s.get(self.url + "/-/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"prometheus not ready in time:\n{self.log.read_text()[-2000:]}")
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    async def query(self, expr: str) -> list[dict]:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/api/v1/query", params={"query": expr}) as r:
                body = await r.json()
        assert body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", (expr, body)
        return body["data"]["result"]

    async def wait_for(self, expr: str, ok, deadline: float, what: str) -> list[dict]:
        """Poll an instant query until ok(result) holds; fail naming `what` at the deadline."""
        while True:
            result = await self.query(expr)
            if ok(result):
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: {expr} gave {result} by the deadline")
            await asyncio.sleep(0.25)


def values(result: list[dict]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


def finite_positive(result: list[dict]) -> bool:
    return bool(result) and all(math.isfinite(v) and v > 0 for v in values(result))


@pytest.fixture
async def prometheus_for(tmp_path):
    binary = prometheus_binary()
    started: list[Prometheus] = []

    async def start(target: str, deadline: float) -> Prometheus:
        prom = Prometheus(binary, tmp_path, target)
        started.append(prom)
        await prom.start(deadline)
        return prom

    yield start
    for prom in started:
        await prom.stop()


async def test_prometheus_scrapes_savings_and_latency(start_gateway, upstream, prometheus_for):
    deadline = time.monotonic() + DEADLINE_S
    # Placeholders and summaries within the short workload (cached reads at half price: folding the
    # placeholders pays early, policies/cost.settle_size).
    gw = await start_gateway(policy={"compact_batch_rounds": 4, "profile": "economy", "cached_input_rate": 0.5})
    prom = await prometheus_for(gw.root.removeprefix("http://"), deadline)
    # Scraped before the traffic, so rates see the counters move.
    await prom.wait_for('up{job="palimpsest"} == 1', bool, deadline, "gateway target never up")

    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-prom", max_retries=0,
                                default_headers={"X-Session-Id": "prometheus"})
    async with client:
        await drive(client, synthetic_session(seed=7, rounds=25), model="fake-32k")
        await client.models.list()  # the pass-through route too

    registry = gw.app[METRICS].registry
    saved = sum(s.value for f in registry.collect() if f.name == "palimpsest_tokens_saved"
                for s in f.samples if s.name.endswith("_total"))
    assert saved > 0, "the workload should have made the gateway save tokens"
    # Prometheus catches up with the gateway's own count: a scrape after the last request, and
    # after the summary job the session's end triggered (they run in the background).
    await prom.wait_for("sum(palimpsest_tokens_saved_total)", lambda r: r and values(r)[0] == saved,
                        deadline, f"saved tokens never reached the gateway's {saved}")
    await prom.wait_for("sum(palimpsest_summary_checkpoints_created_total) >= 1", bool, deadline,
                        "no summary checkpoint was scraped")
    # The pass-through request came after the last chat request: the scrape that showed the
    # saved tokens may predate it.
    await prom.wait_for('sum(palimpsest_requests_total{route="passthrough"}) >= 1', bool, deadline,
                        "the pass-through request was never scraped")

    assert await prom.query("sum(palimpsest_tokens_saved_total) > 0")
    ratio = values(await prom.query(
        "sum(palimpsest_tokens_saved_total) / sum(palimpsest_client_prompt_tokens_total)"))
    assert 0.2 < ratio[0] < 1, ratio
    net = values(await prom.query(
        "sum(palimpsest_tokens_saved_total) - sum(palimpsest_overhead_tokens_total)"))
    assert 0 < net[0] < saved, "summary calls cost something, and far less than was saved"
    savings_rate = await prom.query("sum by (model) (rate(palimpsest_tokens_saved_total[30s]))")
    assert [s["metric"].get("model") for s in savings_rate] == ["fake-32k"] and finite_positive(savings_rate)

    p99 = await prom.query('histogram_quantile(0.99, sum by (le, route, model) '
                           '(rate(palimpsest_request_duration_seconds_bucket{route="chat"}[30s])))')
    assert finite_positive(p99) and all(v < 30 for v in values(p99)), p99
    p50 = values(await prom.query('histogram_quantile(0.5, sum by (le) '
                                  '(rate(palimpsest_request_duration_seconds_bucket{route="chat"}[30s])))'))
    assert 0 < p50[0] <= values(p99)[0]
    overhead = await prom.query("histogram_quantile(0.5, sum by (le) (rate(palimpsest_gateway_overhead_seconds_bucket[30s])))")
    assert finite_positive(overhead) and values(overhead)[0] < 1
    requests = await prom.query("sum by (route, status) (palimpsest_requests_total)")
    assert {(s["metric"]["route"], s["metric"]["status"]) for s in requests} == {("chat", "200"), ("passthrough", "200")}

    # Every dashboard expression is valid PromQL on the real engine; the headline panels have data.
    with_data = set()
    for title, expr in panel_queries(load_dashboard()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, (title, expr)
        if await prom.query(expr):
            with_data.add(title)
    for title in ("Tokens saved (range)", "Savings ratio (range)", "Net savings (range)",
                  "Client vs upstream prompt tokens /s", "Savings ratio",
                  "Request latency p50 / p99 by route, model", "Gateway overhead p50 / p99",
                  "Upstream latency p50 / p99 by model", "Request rate by route, model, status",
                  "Compaction replacements by pass", "Summary jobs", "Store size by component"):
        assert title in with_data, f"panel {title!r} shows no data"


async def test_model_labels_are_configured_or_answered_models_only(start_gateway, upstream):
    gw = await start_gateway(models={"configured-model": {"context_window": 8000}})
    api = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-x", max_retries=0, default_headers={"X-Session-Id": "labels"})
    for model in ("sk-leak-0123456789abcdef", "sk-leak-0123456789abcdef"):
        with pytest.raises(openai.NotFoundError):  # the upstream does not know it
            await api.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    await api.chat.completions.create(model="fake-32k", messages=[{"role": "user", "content": "hi"}])
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.root + "/metrics") as r:
            text = await r.text()
    assert "sk-leak" not in text
    assert 'palimpsest_requests_total{model="other",route="chat",status="404",upstream="default"} 2.0' in text
    assert 'palimpsest_requests_total{model="fake-32k",route="chat",status="200",upstream="default"} 1.0' in text


async def test_metrics_token_guards_metrics(start_gateway):
    gw = await start_gateway(server={"metrics_token": "mt-secret"})
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with s.get(gw.root + "/metrics", headers=headers) as r:
                assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
        async with s.get(gw.root + "/metrics", headers={"Authorization": "Bearer mt-secret"}) as r:
            assert r.status == 200 and "palimpsest_requests_total" in await r.text()
