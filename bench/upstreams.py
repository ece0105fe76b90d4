"""Routing by model to several upstreams (issue 30): the figures of the issue's table.

Two SIMULATED providers on free loopback ports, A (the default [upstream], OpenAI format, serves
gpt-a) and B ([upstreams.b], Anthropic format, serves claude-b), behind one in-process gateway
with two tenants (one with its own key per upstream, one on the operator's keys). It sends every
format (chat, Responses, Messages), JSON and streamed, for both models and both tenants, `--rounds`
times; then `--sessions` long sessions per upstream that need summaries; then /v1/models. It
prints how many requests and summary calls reached the wrong upstream, how many carried a key
that is not the one of their tenant for their upstream, and whether /v1/models is the union.

    .venv/bin/python bench/upstreams.py [--rounds 5] [--sessions 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile

import aiohttp
from aiohttp import web

from gateway.app import create_app
from gateway.keys import SUMMARIZER
from gateway.settings import load_settings
from simulator.puppet import RECEIVED, create_puppet_app

MODELS = {"a": "gpt-a", "b": "claude-b"}
KEYS = {("acme", "a"): "sk-acme-a", ("acme", "b"): "sk-acme-b", ("zed", "a"): "sk-op-a", ("zed", "b"): "sk-op-b"}
CLIENT_KEYS = {"acme": "pk-acme", "zed": "pk-zed"}


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def request_for(kind: str, model: str, tenant: str, stream: bool, session: str, text: str):
    key = CLIENT_KEYS[tenant]
    if kind == "messages":
        return "/v1/messages", {"model": model, "max_tokens": 64, "stream": stream,
                                "messages": [{"role": "user", "content": text}]}, \
            {"X-Session-Id": session, "x-api-key": key, "anthropic-version": "2023-06-01"}
    headers = {"X-Session-Id": session, "Authorization": f"Bearer {key}"}
    if kind == "chat":
        return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream}, headers
    return "/v1/responses", {"model": model, "input": text, "stream": stream}, headers


def credentials(received: dict) -> set[str]:
    h = received["headers"]
    found = {h.get("x-api-key"), h.get("api-key"), (h.get("authorization") or "").removeprefix("Bearer ") or None}
    return {v for v in found if v}


def long_history(rounds: int, tenant: str) -> list[dict]:
    history = []
    for i in range(rounds):
        history.append({"role": "user", "content": f"question {i} from {tenant}: " + " ".join(f"word{i}-{j}" for j in range(400))})
        history.append({"role": "assistant", "content": f"answer {i}: " + " ".join(f"fact{i}-{j}" for j in range(100))})
    return history + [{"role": "user", "content": f"from {tenant}: what next?"}]


async def main(args) -> dict:
    a_app = create_puppet_app(models=("gpt-a",), windows={"gpt-a": 8_000})
    b_app = create_puppet_app(models=("claude-b",), windows={"claude-b": 16_000})
    (a_run, a_root), (b_run, b_root) = await serve(a_app), await serve(b_app)
    store = tempfile.TemporaryDirectory()
    settings = load_settings(None, upstream={"base_url": a_root + "/v1", "api_key": "sk-op-a"},
                             upstreams={"b": {"base_url": b_root + "/v1", "format": "anthropic", "api_key": "sk-op-b",
                                              "models": ["claude-*"]}},
                             tenants={"acme": {"key": "pk-acme", "upstream_key": "sk-acme-a", "upstream_keys": {"b": "sk-acme-b"}},
                                      "zed": "pk-zed"},
                             policy={"profile": "economy", "summary_trigger_ratio": 0.3},
                             store={"path": store.name}, log={"level": "WARNING"})
    gw = create_app(settings)
    gw_run, root = await serve(gw)
    failed = 0
    try:
        async with aiohttp.ClientSession() as http:
            for n in range(args.rounds):
                for tenant in ("acme", "zed"):
                    for model in MODELS.values():
                        for kind in ("chat", "responses", "messages"):
                            for stream in (False, True):
                                path, body, headers = request_for(kind, model, tenant, stream,
                                                                  f"{tenant}-{model}-{kind}-{stream}-{n}", f"hi from {tenant}")
                                async with http.post(root + path, json=body, headers=headers) as r:
                                    await r.read()
                                    failed += r.status != 200
            for n in range(args.sessions):
                for tenant in ("acme", "zed"):
                    for model in MODELS.values():
                        async with http.post(root + "/v1/chat/completions",
                                             json={"model": model, "messages": long_history(28, tenant)},
                                             headers={"X-Session-Id": f"long-{tenant}-{model}-{n}",
                                                      "Authorization": f"Bearer {CLIENT_KEYS[tenant]}"}) as r:
                            await r.read()
                            failed += r.status != 200
            for _ in range(400):
                if gw[SUMMARIZER].idle:
                    break
                await asyncio.sleep(0.05)
            async with http.get(root + "/v1/models", headers={"Authorization": "Bearer pk-acme"}) as r:
                listed = sorted(m["id"] for m in (await r.json())["data"])
    finally:
        await gw_run.cleanup()
        await a_run.cleanup()
        await b_run.cleanup()
        store.cleanup()
    figures: dict = {"client_failures": failed}
    for name, app in (("a", a_app), ("b", b_app)):
        received = [r for r in app[RECEIVED] if r.get("json")]
        work = [r for r in received if r["headers"].get("x-palimpsest-purpose") != "summary"]
        summaries = [r for r in received if r["headers"].get("x-palimpsest-purpose") == "summary"]
        wrong_key = 0
        for r in received:
            tenant = "acme" if "from acme" in str(r["json"]) else "zed"
            wrong_key += credentials(r) != {KEYS[(tenant, name)]}
        figures[name] = {"requests": len(work), "misrouted": sum(r["json"].get("model") != MODELS[name] for r in work),
                         "summary_calls": len(summaries),
                         "summary_misrouted": sum(r["json"].get("model") != MODELS[name] for r in summaries),
                         "summary_paths": sorted({r["path"] for r in summaries}), "wrong_key": wrong_key}
    figures["models_listed"] = listed
    figures["models_union"] = listed == sorted(MODELS.values())
    return figures


def report(f: dict) -> None:
    print("| figure | A (default, openai) | B (anthropic) |")
    print("|---|---|---|")
    print(f"| requests received (chat + Responses + Messages, JSON + streamed) | {f['a']['requests']} | {f['b']['requests']} |")
    print(f"| of them for the other upstream's model (misrouted) | {f['a']['misrouted']} | {f['b']['misrouted']} |")
    print(f"| summary calls received | {f['a']['summary_calls']} | {f['b']['summary_calls']} |")
    print(f"| of them for the other upstream's sessions | {f['a']['summary_misrouted']} | {f['b']['summary_misrouted']} |")
    print(f"| summary call path | {', '.join(f['a']['summary_paths'])} | {', '.join(f['b']['summary_paths'])} |")
    print(f"| calls carrying a key other than their tenant's for this upstream | {f['a']['wrong_key']} | {f['b']['wrong_key']} |")
    print(f"\n/v1/models: {f['models_listed']} (union of both: {f['models_union']}); client requests not 200: {f['client_failures']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args()
    figures = asyncio.run(main(args))
    report(figures)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)
