"""Real servers for the scale-out tests, started by scripts/cluster.sh (what users run).

Missing binaries (PostgreSQL, nginx) skip these tests on a developer's machine but fail them
under CI=true, where they must run. A test database is created per test and dropped after."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster.sh"


def need(what: str, present: bool) -> None:
    if present:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI (see .ci/run)")
    pytest.skip(f"{what} not installed")


def pg_installed() -> bool:
    return any(Path("/usr/lib/postgresql").glob("*/bin/postgres"))


def free_base_port() -> int:
    """A base port with the next 20 ports free (the cluster's layout)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base > 60000:
            continue
        taken = False
        for p in range(base, base + 20):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    taken = True
                    break
        if not taken:
            return base
    raise RuntimeError("no free port range")


def cluster(env: dict, *args: str, timeout: float = 180) -> str:
    out = subprocess.run([str(CLUSTER), *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"cluster.sh {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """(env for cluster.sh, admin url, base url template) of a private PostgreSQL."""
    need("PostgreSQL (apt-get install postgresql)", pg_installed())
    need("psycopg and moto (pip install -e '.[cluster]')", all(importlib.util.find_spec(m) for m in ("psycopg", "psycopg_pool", "moto")))
    # Not under pytest's 0700 tmp dir: PostgreSQL runs as its own user when tests run as root.
    root = Path(tempfile.mkdtemp(prefix="palimpsest-pg-"))
    os.chmod(root, 0o755)
    env = {"CLUSTER_DIR": str(root), "BASE_PORT": str(free_base_port()), "PG_FSYNC": "off"}
    cluster(env, "pg", "up")
    port = env["BASE_PORT"]
    yield {"env": env, "admin": f"postgresql://postgres@127.0.0.1:{port}/postgres",
           "url": f"postgresql://palimpsest:palimpsest@127.0.0.1:{port}/{{db}}"}
    cluster(env, "pg", "down")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres):
    """A fresh database for one test."""
    import psycopg

    name = "t_" + secrets.token_hex(6)
    with psycopg.connect(postgres["admin"], autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} OWNER palimpsest")
    yield postgres["url"].format(db=name)
    with psycopg.connect(postgres["admin"], autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def s3(postgres):
    """moto's S3 server (started by cluster.sh next to the PostgreSQL); yields [recall] settings."""
    env = postgres["env"]
    cluster(env, "s3", "up")
    endpoint = f"http://127.0.0.1:{int(env['BASE_PORT']) + 1}"
    yield {"index_uri": "s3://palimpsest-index/{prefix}", "index_endpoint": endpoint,
           "index_access_key_id": "testing", "index_secret_access_key": "testing"}
    cluster(env, "s3", "down")


@pytest.fixture
def shared_store(pg_url, s3, tmp_path):
    """Settings sections for replicas sharing one PostgreSQL database and one S3 index."""
    prefix = "t" + secrets.token_hex(4)

    def sections(replica: int, **extra) -> dict:
        return {"store": {"path": str(tmp_path / f"replica-{replica}"), "url": pg_url},
                "recall": {**s3, "index_uri": s3["index_uri"].format(prefix=prefix)}, **extra}
    return sections
