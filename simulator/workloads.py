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


# --- agent loops: one user message, then dozens of tool calls --------------------------------


@dataclass
class AgentLoopSession:
    """Turns of an autonomous agent: each a user task, then ``steps`` tool calls in a row.

    A step is {"tool", "args", "output"}; every output but a turn's last ends with the
    ``[[call NAME {json}]]`` directive of the next step, so the puppet (which reads its next
    move from the last message) keeps calling tools until the turn's work is done. Facts are
    buried in tool outputs of early steps and asked at the end.
    """

    turns: list[dict] = field(default_factory=list)  # {"user": str, "steps": [step, ...]}
    facts: list[Fact] = field(default_factory=list)  # Fact.round = global step index
    system: str = ("You are an autonomous coding agent working in the repository /srv/app. Work through the task "
                   "with tools until it is done, then report.")

    @property
    def steps(self) -> int:
        return sum(len(t["steps"]) for t in self.turns)


def call_directive(tool: str, args: dict) -> str:
    return f"[[call {tool} {json.dumps(args)}]]"


def agent_loop_session(seed: int = 0, turns: int = 1, calls: int = 64, facts: int = 6,
                       min_tokens: int = 300, max_tokens: int = 2500) -> AgentLoopSession:
    """``turns`` user turns of ``calls`` tool calls each; deterministic for a seed."""
    rng = random.Random(seed)
    session = AgentLoopSession()
    total = turns * calls
    planted = _FACTS[:facts]
    # Early in the session (the first 60% of steps), never in a turn's last step.
    spots = [int((i + 0.5) * 0.6 * total / max(1, len(planted))) for i in range(len(planted))]
    plant_at = {}
    for spot, fact in zip(spots, planted):
        if spot % calls == calls - 1:
            spot -= 1
        plant_at[spot] = fact
    step_index = 0
    for t in range(turns):
        steps = []
        for c in range(calls):
            tool = TOOLS[(step_index * 5 + t) % len(TOOLS)]
            target = f"/srv/app/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"
            kind = {"read_file": "code", "list_dir": "listing", "query_db": "json"}.get(tool, "log")
            output = _filler(rng, rng.randint(min_tokens, max_tokens), kind)
            fact = plant_at.get(step_index)
            if fact is not None:
                statement, question, paraphrase, answer = fact
                lines = output.split("\n")
                lines.insert(len(lines) // 2, f"NOTE {statement}")
                output = "\n".join(lines)
                session.facts.append(Fact(step_index, statement, question, paraphrase, answer))
            steps.append({"tool": tool, "args": {"target": target}, "output": output})
            step_index += 1
        for here, after in zip(steps, steps[1:]):
            here["output"] = f"{here['output']}\nnext: {call_directive(after['tool'], after['args'])}"
        first = steps[0]
        user = (f"Task {t + 1}: find why the {rng.choice(WORDS)} {rng.choice(WORDS)} fails under load and fix it; "
                f"inspect whatever you need. {call_directive(first['tool'], first['args'])}")
        session.turns.append({"user": user, "steps": steps})
    return session
