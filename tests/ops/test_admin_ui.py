"""The inspector page in headless Chromium: it loads, renders a session's timeline from the
admin API, and logs no console errors.

Chromium is driven over the DevTools protocol with aiohttp's websocket client (no extra Python
dependency). Without a chromium binary the test is skipped, except under CI (``CI`` set),
where a missing browser must fail rather than silently skip the check.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from tests.ops.test_admin import TOKEN, client, long_session

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture
def chromium_path() -> str:
    found = next((p for p in map(shutil.which, BROWSERS) if p), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (Debian package 'chromium'); CI must run the inspector UI test")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


class Browser:
    """One headless Chromium page over the DevTools protocol; collects console errors."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.errors: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                future = self.pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                self.errors.append("log: " + params["entry"].get("text", ""))

    async def send(self, method: str, **params):
        n = next(self.ids)
        future = self.pending[n] = asyncio.get_running_loop().create_future()
        await self.ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 30)
        assert "error" not in reply, reply
        return reply.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def screenshot(self, selector: str, path: Path) -> bytes:
        """A PNG of the element `selector` (the whole of it, scrolled or not), also written to `path`."""
        box = await self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(); "
                                  "return {x: r.left, y: r.top + scrollY, width: r.width, height: r.height}; })()")
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip={**box, "scale": 1})
        png = base64.b64decode(shot["data"])
        path.write_bytes(png)
        return png

    async def wait_for(self, expression: str, timeout: float = 20.0):
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {expression}; errors: {self.errors}")
            await asyncio.sleep(0.1)


async def _launch_chromium(chromium_path: str, profile: Path, log: Path, wait_s: float):
    """Starts headless Chromium and returns (process, DevTools port), or (process, None) when it
    exited or wrote no port file within wait_s. Its stderr goes to `log` for the failure message."""
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            chromium_path, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
            "--disable-default-apps", "--window-size=1280,1600", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", "about:blank",
            stdout=asyncio.subprocess.DEVNULL, stderr=err)
    port_file = profile / "DevToolsActivePort"
    deadline = asyncio.get_running_loop().time() + wait_s
    while asyncio.get_running_loop().time() < deadline and proc.returncode is None:
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text().split()[0])
        await asyncio.sleep(0.1)
    return proc, None


async def _stop(proc) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def browser(chromium_path, tmp_path):
    # A loaded CI machine once took over 30 s to bring Chromium up (no port file, no stderr kept), so
    # the launch waits 60 s and is tried once more with a fresh profile before the test errors out
    # with what Chromium printed.
    for attempt in (1, 2):
        log = tmp_path / f"chromium-{attempt}.log"
        proc, port = await _launch_chromium(chromium_path, tmp_path / f"chromium-profile-{attempt}", log, 60.0)
        if port is not None:
            break
        await _stop(proc)
    else:
        raise RuntimeError(f"chromium did not start (exit {proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                pages = [t for t in await r.json() if t["type"] == "page"]
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Browser(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await page.send(f"{domain}.enable")
                yield page
                page.reader.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def test_inspector_page_renders_a_session_timeline(start_gateway, browser, tmp_path):
    # Summaries only when placeholders pile up, so the newest view shows both summary and placeholders.
    gw = await start_gateway(server={"admin_token": TOKEN},
                             policy={"profile": "economy", "summary_trigger_ratio": 0.6, "sync_compaction_ratio": 0.9,
                                     "compact_trigger_ratio": 0.25, "view_target_ratio": 0.05})
    session, history, _, record = await long_session(gw)
    # One recall round, so the timeline has gateway-made side events to show.
    history.append({"role": "user", "content": f"RECALL: {session.facts[0].question}"})
    await client(gw, "long").chat.completions.create(model="fake-32k", messages=history)

    await browser.send("Page.navigate", url=f"{gw.root}/admin/ui#token={TOKEN}&session={record.key}")
    assert await browser.wait_for("document.body && document.body.dataset.state") == "ready"
    page = await browser.evaluate("""(() => ({
        url: location.href,
        stored: sessionStorage.getItem('palimpsest-admin-token'),
        events: document.querySelectorAll('#timeline li.ev[data-role]').length,
        roles: [...new Set([...document.querySelectorAll('#timeline li.ev[data-role]')].map(li => li.dataset.role))].sort(),
        boundary: document.querySelector('#boundary')?.textContent,
        summarized: document.querySelectorAll('#timeline .flag.summarized').length,
        compacted: document.querySelectorAll('#timeline .flag.compacted').length,
        recall: document.querySelectorAll('#timeline .side-event').length,
        turns: document.querySelectorAll('#timeline .turn-row').length,
        totals: document.querySelector('#totals').textContent,
        summaries: [...document.querySelectorAll('.checkpoint .summary-text')].map(p => p.textContent),
    }))()""")
    detail = await _detail(gw, record.key)
    assert "token=" not in page["url"] and page["stored"] == TOKEN  # the token left the URL
    assert page["events"] == len(detail["events"]) > 50
    assert page["roles"] == ["assistant", "tool", "user"]
    assert page["boundary"] and detail["basis"]["checkpoint"] in page["boundary"]
    assert page["summarized"] == sum(e["summarized"] for e in detail["events"]) > 0
    assert page["compacted"] == sum(e["compacted"] for e in detail["events"]) > 0
    assert page["recall"] >= 2
    assert page["turns"] == detail["totals"]["requests"]
    assert f"{detail['totals']['saved_tokens']:,}" in page["totals"]
    assert page["summaries"] and all("## " in text for text in page["summaries"])

    # The exact projected view, on demand.
    await browser.evaluate("[...document.querySelectorAll('button')].find(b => b.textContent.includes('projected view')).click()")
    assert await browser.wait_for("document.querySelectorAll('#view .msg').length") >= 3
    assert "<session_summary>" in await browser.evaluate("[...document.querySelectorAll('#view .msg pre')].map(p => p.textContent).join(' ')")

    # Back to the session list (the token stays in this tab's sessionStorage).
    await browser.send("Page.navigate", url=f"{gw.root}/admin/ui")
    await browser.wait_for("!!document.querySelector('#sessions')")
    assert "long" in await browser.evaluate("document.querySelector('#sessions').textContent")

    shot = await browser.send("Page.captureScreenshot", format="png")
    assert len(shot["data"]) > 1000
    assert browser.errors == []


async def _detail(gw, key: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.root}/admin/sessions/{key}", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            return await r.json()


async def test_a_crafted_fragment_cannot_send_the_token_elsewhere(start_gateway, upstream, browser):
    """`#session=../../v1/x` made the page fetch /v1/x with the admin token; now a session key
    of the wrong shape is refused before any request, and the gateway never forwards the token."""
    gw = await start_gateway(server={"admin_token": TOKEN})
    for fragment in ("session=../../v1/x", "session=..%2F..%2Fv1%2Fx", "session=a/0123456789abcdef0123&head=../../v1/x"):
        await browser.send("Page.navigate", url=f"{gw.root}/admin/ui#token={TOKEN}&{fragment}")
        assert await browser.wait_for("document.body && document.body.dataset.state") == "error"
        assert "not a session key" in await browser.evaluate("document.querySelector('.error').textContent")
    assert upstream.received == []  # nothing, and so no admin token, went upstream


async def test_inspector_chart_draws_the_requests_and_opens_their_receipts(start_gateway, browser, tmp_path):
    """The session chart (uPlot, served from the package): one point per answered request,
    markers for compaction events and new summaries, the plot really painted, and a click on a
    request opens that request's receipt. The screenshot of the chart is kept in tmp_path."""
    gw = await start_gateway(server={"admin_token": TOKEN},
                             policy={"profile": "economy", "summary_trigger_ratio": 0.6, "sync_compaction_ratio": 0.9,
                                     "compact_trigger_ratio": 0.25, "view_target_ratio": 0.05})
    _, _, _, record = await long_session(gw)
    turns = (await _detail(gw, record.key))["turns"]
    events = [i for i, t in enumerate(turns) if t["compaction_event"]]
    summaries = sum(1 for i, t in enumerate(turns) if t["checkpoint"] and t["checkpoint"] != (turns[i - 1]["checkpoint"] if i else None))
    assert events and summaries and all(t["receipt"] for t in turns)

    await browser.send("Page.navigate", url=f"{gw.root}/admin/ui#token={TOKEN}&session={record.key}")
    assert await browser.wait_for("document.body && document.body.dataset.state") == "ready"
    chart = await browser.evaluate("""(() => { const c = document.querySelector('#chart');
        return {...c.dataset, canvas: !!c.querySelector('canvas'), points: window.sessionChart.data[0].length,
                upstream: window.sessionChart.data[2]}; })()""")
    assert chart["canvas"] and int(chart["requests"]) == chart["points"] == len(turns)
    assert chart["upstream"] == [t["upstream_tokens"] for t in turns]
    assert int(chart["compactions"]) == len(events) and int(chart["summaries"]) == summaries
    # The lines and the markers were painted: pixels of the upstream series and of the markers.
    painted = await browser.evaluate("""(() => { const c = document.querySelector('#chart canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let line = 0, mark = 0;
        const near = (i, r, g, b) => Math.abs(d[i] - r) < 40 && Math.abs(d[i + 1] - g) < 40 && Math.abs(d[i + 2] - b) < 40 && d[i + 3] > 200;
        for (let i = 0; i < d.length; i += 4) { if (near(i, 47, 95, 208)) line++; if (near(i, 122, 43, 181)) mark++; }
        return {line, mark}; })()""")
    assert painted["line"] > 200 and painted["mark"] > 50, painted

    # Click the request that carried the first compaction event: its receipt opens.
    k = events[0]
    x, y = await browser.evaluate(f"""(() => {{ const u = window.sessionChart, r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos({k + 1}, 'x'), r.top + r.height / 2]; }})()""")
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        await browser.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
    assert await browser.wait_for("document.querySelector('#receipt').dataset.receipt") == turns[k]["receipt"]
    shown = json.loads(await browser.evaluate("document.querySelector('#receipt .receipt-json').textContent"))
    assert shown["id"] == turns[k]["receipt"] and shown["events"]["here"] is True
    assert shown["prompt"]["tokens"] == sum(i["tokens"] for i in shown["prompt"]["items"])

    png = await browser.screenshot("#chart", tmp_path / "session-chart.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert browser.errors == []
