"""``palimpsest demo`` runs offline, says its upstream is simulated, and recalls an early fact."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from simulator.workloads import synthetic_session

ROW = re.compile(r"^ *(\d+) +([\d,]+) +([\d,]+) +(\d+)% *(.*)$", re.M)
ARM = re.compile(r"^(compacted|holdout) +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+) +([\d,]+) +(\w+/?\w*)$", re.M)


def client_total(out: str) -> int:
    return int(re.search(r"client prompt tokens\s+([\d,]+)", out).group(1).replace(",", ""))


def run_demo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PALIMPSEST_"))}
    # No network: a proxy that goes nowhere must not matter, everything stays on loopback.
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", ALL_PROXY="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "gateway", "demo", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=Path(__file__).resolve().parents[2])


def test_demo_replays_a_long_session_and_recalls_an_early_fact():
    done = run_demo("--rounds", "40")  # the default: a summary is due well before the end
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "SIMULATED" in out
    assert re.search(r"turn\s+client prompt\s+upstream prompt\s+saved\s+events", out)
    rows = [(int(t), int(c.replace(",", "")), int(u.replace(",", "")), e) for t, c, u, _, e in ROW.findall(out)]
    assert [r[0] for r in rows] == list(range(1, 41))
    assert all(client >= upstream > 0 for _, client, upstream, _ in rows)
    assert rows[-1][2] < rows[-1][1] * 0.5, "by the end, compaction and summaries halve the prompt"
    assert any("checkpoint created" in events for *_, events in rows)
    # The recalled value is the exact one planted early in the bundled session.
    fact = synthetic_session(seed=7, rounds=40).facts[0]
    assert f"recalled: {fact.answer}" in out
    # What recall did, said once: where the value was and which calls the gateway answered.
    (said,) = [line for line in out.splitlines() if f"{fact.answer} was" in line]
    assert re.search(r"answered its 1 recall call \(session_search\) from the ledger\.$", said), said
    assert re.search(r"summary calls\s+[1-9]", out)
    assert re.search(r"client prompt tokens\s+[\d,]+", out) and re.search(r"upstream prompt tokens\s+[\d,]+", out)
    # Both arms of the holdout, the same session each: the holdout arm is sent as direct (no
    # summaries, no recall tools, its oldest rounds cut), and the compacted arm bills less.
    arms = {m.group(1): [int(x.replace(",", "")) for x in m.groups()[1:7]] + [m.group(8)] for m in ARM.finditer(out)}
    assert set(arms) == {"compacted", "holdout"}, out
    compacted, holdout = arms["compacted"], arms["holdout"]
    assert compacted[0] == holdout[0] == 2 * 40 + 1  # two requests a round and the recall question
    assert compacted[1] == client_total(out)  # the totals above are the compacted session's
    assert holdout[5] == 0 and compacted[5] >= 1  # recall calls: none in the holdout
    assert compacted[4] == holdout[4] == 0  # rejections
    assert 0 < compacted[3] < holdout[3], "the compacted arm bills less than the one sent as direct"
    assert compacted[6] == "recalled" and holdout[6] in ("recalled", "lost")
    # The progress bar goes to stderr, finished; stdout stays a clean table.
    assert "40/40 rounds" in done.stderr and "rounds" not in "".join(l for l in out.splitlines() if ROW.match(l))
    assert "Traceback" not in done.stderr
    # Not a terminal: one progress line at the end, none between the rows (2>&1 stays a table).
    assert [l for l in done.stderr.splitlines() if "rounds" in l] == ["[" + "#" * 30 + "] 40/40 rounds"] * 2  # one per arm
    # The answer line quotes the recalled message without the simulator's directives.
    answer = next(l for l in out.splitlines() if l.strip().startswith("answer:"))
    assert "[[" not in answer and fact.answer in answer
    # The temporary store is gone.
    store = re.search(r"\(store (\S+)\)", out).group(1)
    assert not Path(store).exists()


def test_demo_keep_leaves_the_store():
    done = run_demo("--rounds", "2", "--keep")
    assert done.returncode == 0, done.stdout + done.stderr
    store = Path(re.search(r"\(store (\S+)\)", done.stdout).group(1))
    try:
        assert store.is_dir() and any(store.iterdir())
        assert f"store kept in {store}" in done.stdout
    finally:
        shutil.rmtree(store, ignore_errors=True)
