"""The local cluster as users start it (scripts/cluster.sh up): PostgreSQL, moto's S3 server,
nginx hashing X-Session-Id, two gateway replicas, the simulated upstream, all separate
processes. Sessions go through nginx with affinity, then sprayed round-robin, then across a
kill -9 of one replica; the ledger must hold every client message exactly once."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import aiohttp
import pytest

from bench.cluster import Agent, phase, recall_check, verify
from tests.cluster.conftest import cluster, free_base_port, need, pg_installed

REPLICAS = 2


@pytest.fixture(scope="module")
def running_cluster():
    need("PostgreSQL (apt-get install postgresql)", pg_installed())
    need("nginx (apt-get install nginx)", shutil.which("nginx") is not None)
    root = Path(tempfile.mkdtemp(prefix="palimpsest-cluster-test-"))
    os.chmod(root, 0o755)
    env = {"CLUSTER_DIR": str(root), "BASE_PORT": str(free_base_port()), "PG_FSYNC": "off", "UPSTREAM_LATENCY": "0.05"}
    try:
        cluster(env, "up", str(REPLICAS), timeout=300)
    except Exception:
        cluster(env, "down")
        raise
    yield env
    cluster(env, "down")
    shutil.rmtree(root, ignore_errors=True)


def lb_url(env) -> str:
    return f"http://127.0.0.1:{int(env['BASE_PORT']) + 3}/v1/chat/completions"


def pg_url(env) -> str:
    return cluster(env, "env").split("PALIMPSEST_STORE__URL=")[1].split()[0]


async def test_sessions_stay_correct_with_affinity_sprayed_and_across_a_kill(running_cluster):
    env = running_cluster
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        # An odd number of sessions: with round-robin over 2 replicas, sessions taking turns in
        # lockstep then alternate replicas instead of each landing on the same one every time.
        agents = [Agent(f"t-agent-{i}", lb_url(env), http, 30) for i in range(5)]
        await phase(agents, 3)
        # Consistent hashing: each session was served by one replica.
        assert all(len(a.replicas) == 1 for a in agents)
        # And sessions spread over both replicas. Where five ids land depends on the ring (the
        # replicas' ports are random), so one-turn probe sessions add ids until a spread shows;
        # with hashing broken to one replica, 30 probes never find the other.
        probes: list[Agent] = []
        while len({r for a in agents + probes for r in a.replicas}) < REPLICAS and len(probes) < 30:
            probes.append(Agent(f"t-probe-{len(probes)}", lb_url(env), http, 30))
            await phase(probes[-1:], 1)
        assert len({r for a in agents + probes for r in a.replicas}) == REPLICAS
        assert all(len(a.replicas) == 1 for a in probes)
        for a in agents:
            a.replicas.clear()
        cluster({**env, "AFFINITY": "0"}, "nginx", str(REPLICAS))
        await phase(agents, 4)
        # Round-robin: sessions on both replicas. Where one session's requests land depends on
        # how the agents' turns interleave (on a loaded box all 4 can fall on one replica, and
        # agents taking turns in a fixed order can stay in step with the rotation), so a session
        # still on one replica takes up to 4 more turns on its own, back to back; with affinity
        # on, no number of turns would spray it.
        extra = {a.session: 0 for a in agents}
        for a in agents:
            while len(a.replicas) < REPLICAS and extra[a.session] < 4:
                await phase([a], 1)
                extra[a.session] += 1
        assert sum(len(a.replicas) == REPLICAS for a in agents) >= len(agents) - 1
        cluster(env, "nginx", str(REPLICAS))

        async def kill_and_restart() -> None:
            await asyncio.sleep(0.3)
            cluster(env, "replica", "1", "kill")
            await asyncio.sleep(1.0)
            await asyncio.to_thread(cluster, env, "replica", "1", "start")

        await phase(agents, 4, kill_and_restart)
    assert sum(a.errors for a in agents) == 0
    assert all(a.turns == 11 + extra[a.session] for a in agents)
    checked = verify(pg_url(env), agents)
    assert (checked["missing"], checked["duplicated"], checked["forked"], checked["double_checkpoints"]) == (0, 0, 0, 0)
    assert checked["messages"] == sum(11 + extra[a.session] for a in agents)
    recall = await recall_check(env, agents[:3])
    assert recall["found"] == 3


async def test_readiness_and_admin_through_the_load_balancer(running_cluster):
    base = f"http://127.0.0.1:{int(running_cluster['BASE_PORT']) + 3}"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/readyz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ready"
            assert r.headers.get("X-Palimpsest-Replica")
