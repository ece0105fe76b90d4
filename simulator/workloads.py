"""Synthetic long agent sessions: the workload of tests, benchmarks and the offline demo.

A session is a list of rounds; in each, the user asks for something and the (puppet) model
calls a tool whose output is 300-2,500 tokens of plausible logs, listings, JSON or code. Facts
are planted early (in user messages and in tool outputs) and asked about at the end, half of
them in other words. Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

TOOLS = ("read_file", "run_tests", "search_code", "list_dir", "query_db", "http_get")
WORDS = (
    "cache worker queue request handler retry timeout config module import build deploy index "
    "schema migration token client server stream buffer socket parser render template session "
    "ledger summary window budget tenant metric latency thread signal process memory record field "
    "branch commit review patch module package version release bucket region shard replica"
).split()

TOOL_SPECS = [
    {"type": "function", "function": {"name": name, "description": f"{name.replace('_', ' ')} in the workspace",
                                      "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}}}
    for name in TOOLS
]


@dataclass(frozen=True)
class Fact:
    round: int
    statement: str  # where it was planted
    question: str  # asked verbatim-ish
    paraphrase: str  # asked in other words
    answer: str  # exact value expected back


@dataclass
class SyntheticSession:
    rounds: list[dict] = field(default_factory=list)  # {"user", "tool", "args", "output"}
    facts: list[Fact] = field(default_factory=list)
    system: str = "You are a careful coding agent working in the repository /srv/app. Use tools to inspect it."


_FACTS = [
    ("The staging deploy id is DEP-58213; use it for every rollback.", "What is the staging deploy id?",
     "Which identifier should a rollback of staging use?", "DEP-58213"),
    ("Customer reservation code is ZFA04Y, booked under Mara Quist.", "What is the customer's reservation code?",
     "Which booking reference did the client have?", "ZFA04Y"),
    ("The database password rotation ticket is OPS-7731 and it is due 2024-07-19.", "What is the password rotation ticket number?",
     "Which ops ticket tracks rotating the DB credentials?", "OPS-7731"),
    ("Never touch the file /etc/app/secrets.yaml; the migration lives in /srv/app/migrations/0042_add_ledger.py.",
     "Which file holds the migration?", "Where is the schema change script located?", "/srv/app/migrations/0042_add_ledger.py"),
    ("Pinned runtime is python 3.11.7 with uvicorn 0.30.1 behind port 8443.", "What uvicorn version is pinned?",
     "Which release of the ASGI server are we locked to?", "0.30.1"),
    ("The failing test is test_refund_partial_amount in tests/billing/test_refunds.py, off by $12.40.",
     "Which test is failing?", "Which billing check keeps breaking?", "test_refund_partial_amount"),
]


def _filler(rng: random.Random, tokens: int, kind: str) -> str:
    lines, size = [], 0
    while size < tokens:
        if kind == "json":
            line = json.dumps({"id": rng.randint(1000, 99999), "name": rng.choice(WORDS), "state": rng.choice(WORDS),
                               "score": round(rng.random() * 100, 2)})
        elif kind == "code":
            a, b = rng.sample(WORDS, 2)
            line = f"    def {a}_{b}(self, {rng.choice(WORDS)}):  return self.{rng.choice(WORDS)}({rng.randint(0, 99)})"
        elif kind == "listing":
            line = f"-rw-r--r-- 1 app app {rng.randint(100, 99999):>6} Jun {rng.randint(1, 28):>2} /srv/app/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
        else:
            line = f"2024-06-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} INFO {rng.choice(WORDS)}: " + " ".join(rng.choices(WORDS, k=8))
        lines.append(line)
        size += max(8, len(line) // 4)
    return "\n".join(lines)


def synthetic_session(seed: int = 0, rounds: int = 60, facts: int = 6, min_tokens: int = 300, max_tokens: int = 2500) -> SyntheticSession:
    rng = random.Random(seed)
    session = SyntheticSession()
    planted = _FACTS[:facts]
    plant_at = {2 + 2 * i: f for i, f in enumerate(planted)}  # early rounds
    for r in range(rounds):
        tool = TOOLS[r % len(TOOLS)]
        target = f"/srv/app/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
        kind = {"read_file": "code", "list_dir": "listing", "query_db": "json"}.get(tool, "log")
        output = _filler(rng, rng.randint(min_tokens, max_tokens), kind)
        user = f"Step {r + 1}: please {tool.replace('_', ' ')} on {target}."
        fact = plant_at.get(r)
        if fact is not None:
            statement, question, paraphrase, answer = fact
            if r % 4 == 2:
                user = f"{user} Note: {statement}"
            else:
                lines = output.split("\n")
                lines.insert(len(lines) // 2, f"NOTE {statement}")
                output = "\n".join(lines)
            session.facts.append(Fact(r, statement, question, paraphrase, answer))
        args = {"target": target}
        session.rounds.append({"user": f'{user} [[call {tool} {json.dumps(args)}]]', "tool": tool, "args": args, "output": output})
    return session
