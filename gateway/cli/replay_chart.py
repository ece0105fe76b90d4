"""``palimpsest replay --html FILE``: the profile comparison as one self-contained HTML page.

The same kind of chart the inspector draws for a session (``gateway/ops/static/inspector.html``),
per replayed request and per profile: the client's prompt tokens against what each profile sent
upstream, and the billed cost of each profile against the client's own requests sent direct,
with markers where a profile's view plan rewrote the prompt prefix (a compaction event, read from
the replay gateway's own turn log as the inspector reads it), where its view took a new summary,
and where a request was refused. uPlot (vendored in ``gateway/ops/static/``, MIT) and the figures are inlined,
so the file opens offline, from disk, with no server and no CDN. The figures are numbers only:
no message text is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

STATIC = Path(__file__).resolve().parent.parent / "ops" / "static"
# One colour per profile, in --profiles order (the inspector's palette first).
COLORS = ("#2f5fd0", "#b42318", "#05704f", "#8a5a00", "#7a2bb5", "#0e7490")

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>palimpsest replay: profile comparison</title>
<!-- uPlot 1.6.32 (MIT licence below), inlined: this page needs no network. -->
<style>{css}</style>
<style>
  body {{ font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1d2433; background: #f7f8fb; }}
  h1 {{ font-size: 20px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 24px 0 6px; }}
  .note {{ color: #5b6478; }} table {{ border-collapse: collapse; background: #fff; }}
  td, th {{ border: 1px solid #d9dde7; padding: 4px 10px; text-align: right; }} th:first-child, td:first-child {{ text-align: left; }}
  .chart {{ background: #fff; border: 1px solid #d9dde7; border-radius: 8px; padding: 8px; display: inline-block; }}
  .swatch {{ display: inline-block; width: 14px; height: 0; border-top: 3px dashed; vertical-align: middle; margin: 0 4px 0 10px; }}
</style>
</head>
<body>
<h1>What each profile would have billed</h1>
<p class="note" id="summary"></p>
<table id="profiles"></table>
<h2>Prompt tokens per request</h2>
<div class="chart" id="tokens"></div>
<h2>Billed per request (uncached-input-token units, rates <span id="rates"></span>)</h2>
<div class="chart" id="billed"></div>
<p class="note" id="legend"></p>
<script id="replay-data" type="application/json">{data}</script>
<script>{js}</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("replay-data").textContent);
const per = data.per_request, names = Object.keys(per.profiles), colors = data.colors;
const x = per.client_tokens.map((_, i) => i + 1);
const text = (id, value) => {{ document.getElementById(id).textContent = value; }};
text("rates", data.rates);
text("summary", `${{data.sessions}} sessions, ${{data.requests}} requests replayed against the SIMULATED upstream` +
  (data.approximate ? `; ${{data.approximate}} rebuilt approximately (recorded before request forms were kept)` : ""));
const table = document.getElementById("profiles");
const keys = ["requests", "client_prompt_tokens", "upstream_prompt_tokens", "billed", "billed_direct", "billed_ratio",
  "rejections", "summary_calls", "compaction_events", "exact_values_visible"];
const row = (cells, tag) => {{ const tr = table.insertRow(); cells.forEach((c) => {{ const td = document.createElement(tag); td.textContent = c; tr.appendChild(td); }}); }};
row(["profile", ...keys], "th");
data.profiles.forEach((p) => row([p.profile, ...keys.map((k) => p[k] == null ? "n/a" : p[k].toLocaleString())], "td"));
const legend = document.getElementById("legend");
names.forEach((name, i) => {{ const s = document.createElement("span"); s.className = "swatch"; s.style.borderColor = colors[i];
  legend.appendChild(s); legend.appendChild(document.createTextNode(name + ": dashed, a compaction event (the prompt prefix was rewritten); dotted, a new summary in the view")); }});
legend.appendChild(document.createTextNode(" · grey: a new session · red ticks: refused requests"));
function markers(u) {{
  const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
  const line = (index, color, dash, width) => {{
    const px = Math.round(u.valToPos(index + 1, "x", true));
    ctx.save(); ctx.strokeStyle = color; ctx.lineWidth = width * devicePixelRatio; ctx.setLineDash(dash.map((d) => d * devicePixelRatio));
    ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height); ctx.stroke(); ctx.restore();
  }};
  per.session_starts.slice(1).forEach((i) => line(i, "#c3c8d4", [], 1));
  names.forEach((name, k) => {{
    per.profiles[name].prefix_rewrites.forEach((i) => line(i, colors[k], [5, 4], 2));
    per.profiles[name].new_summaries.forEach((i) => line(i, colors[k], [1, 3], 3));
    per.profiles[name].rejections.forEach((i) => {{
      const px = Math.round(u.valToPos(i + 1, "x", true));
      ctx.save(); ctx.fillStyle = "#d92d20"; ctx.fillRect(px - 2 * devicePixelRatio, top, 4 * devicePixelRatio, 10 * devicePixelRatio); ctx.restore();
    }});
  }});
}}
function chart(id, label, baseline, baselineLabel, series) {{
  const box = document.getElementById(id);
  const opts = {{
    width: Math.max(560, Math.min(1400, window.innerWidth - 80)), height: 320,
    scales: {{ x: {{ time: false }} }},
    series: [{{ label: "request" }}, {{ label: baselineLabel, stroke: "#9aa8c7", width: 2 }},
      ...names.map((name, i) => ({{ label: name, stroke: colors[i], width: 2 }}))],
    axes: [{{ label: "request", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }}, {{ label, size: 80 }}],
    hooks: {{ draw: [markers] }},
    cursor: {{ drag: {{ x: false, y: false }} }},
  }};
  Object.assign(box.dataset, {{ requests: x.length, profiles: names.length,
    compactions: names.reduce((n, name) => n + per.profiles[name].prefix_rewrites.length, 0),
    summaries: names.reduce((n, name) => n + per.profiles[name].new_summaries.length, 0) }});
  return new uPlot(opts, [x, baseline, ...names.map((name) => per.profiles[name][series])], box);
}}
window.replayCharts = [
  chart("tokens", "prompt tokens", per.client_tokens, "client tokens (as sent)", "upstream_tokens"),
  chart("billed", "billed units", per.billed_direct, "billed direct (client's own, ideal cache)", "billed"),
];
document.body.dataset.state = "ready";
</script>
<!-- uPlot licence:
{licence}
-->
</body>
</html>
"""


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it is inlined in."""
    return text.replace("</", "<\\/")


def _library() -> str:
    script = (STATIC / "uPlot.iife.min.js").read_text()
    if "</script" in script.lower():  # it has none (1.6.32); a newer copy must not close its element
        raise ValueError("uPlot.iife.min.js cannot be inlined: it holds '</script'")
    return script


def chart_html(result: dict[str, Any], rates: str) -> str:
    """The page for a replay's result (``replay.replay``'s object, ``per_request`` included)."""
    data = dict(result)
    data["colors"] = [COLORS[i % len(COLORS)] for i in range(len(result["per_request"]["profiles"]))]
    data["rates"] = rates
    return PAGE.format(css=(STATIC / "uPlot.min.css").read_text(), js=_library(),
                       data=_script_safe(orjson.dumps(data).decode()),
                       licence=(STATIC / "uPlot.LICENSE").read_text().replace("--", "- -"))


def write_chart(path: str, result: dict[str, Any], rates: str) -> None:
    Path(path).write_text(chart_html(result, rates), encoding="utf-8")
