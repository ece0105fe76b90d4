"""``palimpsest inspect``: the admin API's inspection, printed in the terminal.

It opens the store next to a possibly running gateway (SQLite in WAL mode allows concurrent
readers) and only reads it. Views are projected by the same ``Inspector`` the admin API uses.
The model, window and budget of each request are the ones the gateway recorded in its turn log
when it answered (``store.turns``), so this shows what the live gateway used without calling
the upstream; only a session answered before the turn log existed falls back to configuration
and the table of well-known models. Token calibration is learned by a running gateway and not
stored, so estimates here are uncalibrated (factor 1). A running gateway writes its turn rows
every half second, so the newest request may show here that much later; the admin API sees it
at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

from gateway.pipeline.views import ViewBuilder
from gateway.http.errors import GatewayError
from gateway.ops.inspection import Inspector, ViewInputs, list_sessions
from gateway.ops.readonly import ConfiguredWindows
from gateway.settings import Settings
from policies import Calibration, TokenCounter
from store import close_stores, open_stores
from store.turns import TurnLog

FLAGS = (("summarized", "S"), ("compacted", "C"), ("dropped", "D"))


def view_inputs(args) -> ViewInputs:
    """The client's system prompt and tools from --system (text, or @file) and --tools (a JSON
    file): the ledger does not store them, and the exact view needs them."""
    system, tools = getattr(args, "system", None), None
    if system and system.startswith("@"):
        try:
            system = Path(system[1:]).read_text()
        except OSError as exc:
            raise ValueError(f"--system: cannot read {system[1:]}: {exc.strerror}") from None
    if getattr(args, "tools", None):
        try:
            tools = json.loads(Path(args.tools).read_text())
        except OSError as exc:
            raise ValueError(f"--tools: cannot read {args.tools}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--tools: {args.tools} is not JSON: {exc}") from None
        if isinstance(tools, dict) and isinstance(tools.get("tools"), list):  # a saved request body
            tools = tools["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ValueError(f"--tools: {args.tools} must hold a JSON array of tools")
    return ViewInputs(system=system or None, tools=tools)


def run_inspect(args, settings: Settings) -> int:
    try:
        inputs = view_inputs(args)
    except ValueError as exc:
        print(f"palimpsest: {exc}", file=sys.stderr)
        return 2
    root = Path(settings.store.path)
    if not root.is_dir():  # opening a store creates it: do not leave an empty one behind
        print(f"palimpsest: no store at {root} (set store.path or --config)", file=sys.stderr)
        return 1
    try:
        return asyncio.run(_inspect(args, settings, inputs))
    except GatewayError as exc:
        print(f"palimpsest: {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `palimpsest inspect | head`: the reader left early, which is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


async def _inspect(args, settings: Settings, inputs: ViewInputs) -> int:
    ledger, checkpoints = open_stores(settings.store)
    turns = TurnLog(settings.store.path, synchronous=settings.store.sync)
    try:
        if not args.session:  # listing needs no view builder (and no tokenizer)
            sessions = list_sessions(ledger, checkpoints, args.tenant)
            print(json.dumps({"object": "list", "data": sessions}, indent=2) if args.json else sessions_table(sessions))
            return 0
        # No upstream: windows are the recorded ones, else configuration (never a network call).
        windows = ConfiguredWindows({k: v.context_window for k, v in settings.models.items() if v.context_window})
        views = ViewBuilder(settings=settings, windows=windows, counter=TokenCounter(), calibration=Calibration(),
                            checkpoints=checkpoints, metrics=None)
        inspector = Inspector.wrap(ledger=ledger, checkpoints=checkpoints, views=views, settings=settings, turns=turns)
        record = inspector.find(args.session, args.tenant)
        if args.view:
            view = await inspector.projected_view(record, inputs=inputs)
            print(json.dumps(view, indent=2, ensure_ascii=False) if args.json else view_text(view))
            return 0
        detail = await inspector.session_detail(record, inputs=inputs)
        print(json.dumps(detail, indent=2, ensure_ascii=False) if args.json else detail_text(detail))
        return 0
    finally:
        turns.close()
        close_stores(ledger, checkpoints)


# -- rendering -------------------------------------------------------------------------------

def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _width() -> int:
    return max(80, shutil.get_terminal_size((120, 24)).columns)


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _capped(values: list, shown: int = 8) -> str:
    more = f" (+{len(values) - shown} more; --json has all)" if len(values) > shown else ""
    return ", ".join(str(v) for v in values[:shown]) + more


def sessions_table(sessions: list[dict]) -> str:
    if not sessions:
        return "no sessions"
    rows = [[s["key"], _one_line(s["session_id"], 40), s["events"], s["requests"], s["checkpoints"], _when(s["updated"])]
            for s in sessions]
    return _table(["KEY", "SESSION ID", "EVENTS", "REQUESTS", "CHECKPOINTS", "UPDATED"], rows, right={2, 3, 4})


def detail_text(d: dict) -> str:
    s, t, basis = d["session"], d["totals"], d["basis"]
    out = [f"session {s['session_id']}  ({s['key']})",
           f"created {_when(s['created'])}  updated {_when(s['updated'])}  events {s['events']}  requests {s['requests']}",
           f"view basis: model {basis['model']} ({basis['model_source']}) on upstream {basis.get('upstream', 'default')}, window {basis['window']:,}, budget {basis['budget']:,} "
           f"({basis['window_source']}), checkpoint {basis['checkpoint'] or '-'}",
           f"tokens: client {t['client_tokens']:,}  upstream {t['upstream_tokens']:,}  saved {t['saved_tokens']:,} "
           f"({t['saved_ratio']:.0%})  recall calls {t['recall_calls']}",
           "", "branches:"]
    out += [f"  {'*' if b['head'] == d['head'] else ' '} {b['head']}  {b['length']} events  {_when(b['updated'])}" for b in d["branches"]]
    turns = {turn["event"]: turn for turn in d["turns"]}
    boundary = basis["boundary"]
    width = _width() - 36
    out += ["", f"events of {d['head']}  (S summarized, C compacted, D dropped by tailoring):"]
    for e in d["events"]:
        marks = "".join(mark if e[name] else "." for name, mark in FLAGS)
        out.append(f"  {e['seq']:>5} {e['role']:<9} {e['tokens']:>6} {marks}  {_one_line(e['preview'], width)}")
        for side in e["side_events"]:
            kind = "recall call" if side["tool_calls"] else "recall result"
            out.append(f"  {'':>5} ↳ {kind:<13} {side['tokens']:>6}  {_one_line(side['preview'], width - 8)}")
        turn = turns.get(e["id"])
        if turn:
            cached = "" if turn.get("cached_tokens") is None else f", provider cached {turn['cached_tokens']:,}"
            out.append(f"  {'':>5}   request: client {turn['client_tokens']:,} → upstream {turn['upstream_tokens']:,} tokens{cached}"
                       f"  ({turn['model']}, window {turn['window']:,}, budget {turn['budget']:,})")
        if e["id"] == boundary:
            out.append(f"  {'':>5}   ==== summary boundary ({basis['checkpoint']}): events above are summarized ====")
    out += ["", f"checkpoints ({len(d['checkpoints'])}):"]
    for cp in d["checkpoints"]:
        flags = ", ".join(f for f, on in (("in view", cp["in_view"]), ("other branch", not cp["on_path"])) if on)
        out.append(f"  v{cp['version']} {cp['id']}  {cp['mode']}  {cp['model']}  {_when(cp['created'])}  boundary {cp['boundary']}  "
                   f"covers {cp['covered_events']} events / {cp['covered_tokens']:,} tokens  summary {cp['summary_tokens']} tokens"
                   + (f"  [{flags}]" if flags else ""))
        out += ["    " + line for line in cp["summary"].splitlines()]
        out += [f"    state {kind}: " + _capped(values) for kind, values in cp["state"].items() if values]
    if basis["system_prompt"] != "given":
        out += ["", "note: " + basis["system_prompt"]]
    return "\n".join(out)


def view_text(v: dict) -> str:
    tokens = v["tokens"]
    out = [f"projected view of {v['session']} at {v['head']}",
           f"model {v['model']} ({v['model_source']}) on {v.get('upstream', 'default')}  checkpoint {v['checkpoint'] or '-'}  "
           f"{'untouched' if v['untouched'] else 'projected'}: {tokens['upstream']:,} of {tokens['client']:,} tokens, "
           f"budget {tokens['budget']:,}",
           f"note: {v['system_prompt']}" if v["system_prompt"] != "given" else ""]
    for i, m in enumerate(v["messages"]):
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
        calls = " ".join(f"→ {c['function']['name']}({c['function'].get('arguments', '')})" for c in m.get("tool_calls") or ())
        out += [f"--- [{i}] {m['role']}" + (f" ({m['tool_call_id']})" if m.get("tool_call_id") else ""), text + calls]
    names = [t.get("function", {}).get("name") for t in v["tools"] or ()]
    out.append(f"--- tools: {', '.join(n for n in names if n) or 'none'}")
    return "\n".join(line for line in out if line is not None)
