"""The inspector reads every format's sessions: the ledger's neutral items are not checked
against chat's declared request shape (a Responses ``shell_call_output`` holds an array of
objects without ``type``, which no chat content part may be)."""

from __future__ import annotations

import aiohttp

from gateway.keys import LEDGER

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHELL = [
    {"type": "message", "role": "user", "content": "list the files"},
    {"type": "shell_call", "call_id": "call_sh", "action": {"commands": ["ls"]}, "status": "completed"},
    {"type": "shell_call_output", "call_id": "call_sh",
     "output": [{"stdout": "a.py\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
    {"type": "message", "role": "user", "content": "and now?"},
]


async def test_a_responses_session_with_typeless_output_objects_can_be_inspected(start_gateway):
    gw = await start_gateway(server={"admin_token": TOKEN})
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.base_url + "/responses", json={"model": "fake-32k", "input": SHELL},
                          headers={"X-Session-Id": "shell"}) as r:
            assert r.status < 500, await r.text()
        record = next(r for r in gw.app[LEDGER].sessions() if r.session_id == "shell")
        assert any(e.message.get("role") == "tool" for e in gw.app[LEDGER].since(record.key, -1))
        for tail in ("", "/view"):
            async with s.get(f"{gw.root}/admin/sessions/{record.key}{tail}", headers=AUTH) as r:
                assert r.status == 200, (tail, await r.text())
