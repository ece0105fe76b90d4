"""Dependency floors exclude releases with published security fixes, and the lock file CI
installs pins every dependency at a version the floors allow."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# Dependencies with published advisories: their floors are the lock's releases (issue 26), so no
# install admits a release with a fix the lock already has.
FIXED = {"aiohttp": Version("3.14.5"), "orjson": Version("3.13.0"), "pyarrow": Version("26.0.1"),
         "diskcache": Version("5.6.3"), "pytest": Version("9.2.0")}


def requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for r in project["optional-dependencies"]["test"] if not r.startswith("palimpsest")]
    return {r.name.lower(): r for r in reqs}


def pins() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = Version(version)
    return out


def test_floors_exclude_the_vulnerable_releases():
    reqs = requirements()
    for name, fixed in FIXED.items():
        floor = min((Version(s.version) for s in reqs[name].specifier if s.operator == ">="), default=Version("0"))
        assert floor >= fixed, f"{name} floor {floor} admits releases before the fix in {fixed}"


def test_the_lock_pins_every_dependency_within_its_floor():
    locked = pins()
    for name, req in requirements().items():
        key = re.sub(r"[-_.]+", "-", name).lower()
        assert key in locked, f"{name} is not pinned in requirements.lock"
        assert req.specifier.contains(locked[key], prereleases=True), f"{name}=={locked[key]} outside {req.specifier}"


def test_ci_installs_the_lock():
    assert "-c requirements.lock" in (ROOT / "scripts" / "test.sh").read_text()
