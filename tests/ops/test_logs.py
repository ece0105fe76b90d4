"""Access log lines cannot be forged: a client's path or session id with a line break, a
control character or a ` key=value` of its own stays one escaped value on one line."""

from __future__ import annotations

import json
import logging
import re

import aiohttp

from gateway.ops.logs import JsonFormatter, TextFormatter

FORGED = "/v1/x%0a2026-12-01 INFO palimpsest.access request status=200 tenant=admin%0d%1b[2J"


async def test_a_forged_path_stays_one_escaped_value(gateway, upstream, caplog):
    caplog.set_level(logging.INFO, logger="palimpsest.access")
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.root + FORGED, headers={"X-Session-Id": "s\u2028status=201"}) as r:
            await r.read()
    records = [r for r in caplog.records if r.name == "palimpsest.access" and "x\n" in str(r.fields.get("route"))]
    assert records, "the request was logged"
    line = TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s").format(records[0])
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)  # quoted values out: what a key=value parser splits
    assert bare.count(" status=") == 1 and " tenant=admin" not in bare
    assert "\\n2026-12-01" in line  # still readable, escaped
    data = json.loads(JsonFormatter().format(records[0]))
    assert data["route"].startswith("/v1/x\n2026") and "\n" not in JsonFormatter().format(records[0])
