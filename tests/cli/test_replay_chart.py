"""``palimpsest replay --html FILE`` (gateway/cli/replay_chart.py): one self-contained page that
draws, per replayed request and per profile, the upstream tokens against the client's, the bill
against billed direct, and the compaction markers; it renders from disk in headless Chromium with
no network (uPlot inlined), as the inspector's chart does (tests/ops/test_admin_ui.py)."""

from __future__ import annotations

import json
import re

from tests.ops.test_admin_ui import browser, chromium_path  # noqa: F401 (fixtures)
from tests.cli.test_replay import LIVE, MODEL, ROUNDS, _live
from tests.cli.test_replay_store import _cli


async def test_the_html_chart_renders_a_profile_comparison_offline(browser, tmp_path):  # noqa: F811
    await _live("chat", tmp_path, MODEL, ROUNDS)  # a stored session that compacts under economy
    config = tmp_path / "replay.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "live"}"\n')
    page = tmp_path / "replay.html"
    done = _cli("--config", str(config), "--profiles", f"{LIVE},balanced", "--json", "--html", str(page), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "per_request" not in result  # the --json object stays the shape
    html = page.read_text()
    # One file, nothing fetched: no script or stylesheet source, no URL but the licence's.
    assert not re.search(r"<(script|link)[^>]+(src|href)=", html) and "uPlot" in html
    summaries = sum(p["compaction_events"] for p in result["profiles"])  # a new checkpoint in the view
    assert summaries >= 1

    await browser.send("Page.navigate", url=page.as_uri())
    assert await browser.wait_for("document.body && document.body.dataset.state") == "ready"
    charts = await browser.evaluate("""[...document.querySelectorAll('.chart')].map((c) => ({...c.dataset,
        canvas: !!c.querySelector('canvas')}))""")
    assert [c["canvas"] for c in charts] == [True, True]
    assert all(int(c["requests"]) == result["requests"] and int(c["profiles"]) == 2 for c in charts)
    assert all(int(c["summaries"]) == summaries for c in charts)
    assert int(charts[0]["compactions"]) >= summaries  # every new summary in the view rewrote the prefix, and
    # tool-result placeholders did too
    series = await browser.evaluate("window.replayCharts.map((u) => u.data.map((s) => s.reduce((a, b) => a + (b || 0), 0)))")
    tokens, billed = series
    economy, balanced = result["profiles"]
    assert tokens[1] == economy["client_prompt_tokens"]
    assert tokens[2] == economy["upstream_prompt_tokens"] and tokens[3] == balanced["upstream_prompt_tokens"]
    assert abs(billed[2] - economy["billed"]) < 1 and abs(billed[1] - economy["billed_direct"]) < 1
    rows = await browser.evaluate("document.querySelectorAll('#profiles tr').length")
    assert rows == 3
    # The lines and the compaction markers were painted (the first profile's colour, #2f5fd0).
    painted = await browser.evaluate("""(() => { const c = document.querySelector('#tokens canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
        for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i] - 47) < 40 && Math.abs(d[i + 1] - 95) < 40 && Math.abs(d[i + 2] - 208) < 40 && d[i + 3] > 200) n++;
        return n; })()""")
    assert painted > 200, painted
    png = await browser.screenshot("#tokens", tmp_path / "replay-chart.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert browser.errors == []
