"""One step of a scripted tool chain for real coding-agent CLIs (stdlib only, run as a command).

``python3 chain.py CLIENT STEP TOTAL`` prints 1,000-3,000 tokens of plausible build log, then
the simulator directive that makes the model run step STEP+1 with the CLI's own shell tool
(``exec_command`` for Codex, ``Bash`` for Claude Code); the last step prints ``CHAIN COMPLETE``
instead, so the model answers in text and the CLI exits. Output is deterministic per step.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = ("cache worker queue request handler retry timeout config module import build deploy "
         "index schema migration token client server stream buffer socket parser render "
         "template session ledger summary window budget tenant metric latency thread signal "
         "process memory record field branch commit review patch package version release").split()
SCRIPT = str(Path(__file__).resolve())


def directive(client: str, step: int, total: int) -> str:
    command = f"python3 {SCRIPT} {client} {step} {total}"
    if client == "codex":
        return f"[[call exec_command {json.dumps({'cmd': command})}]]"
    if client == "qwen":  # Qwen Code's shell tool
        return f"[[call run_shell_command {json.dumps({'command': command, 'description': f'chain step {step}'})}]]"
    return f"[[call Bash {json.dumps({'command': command, 'description': f'chain step {step}'})}]]"


def first_prompt(client: str, total: int) -> str:
    return (f"Run the build chain: each step prints the next command to run. Run them all, one "
            f"at a time, until it says CHAIN COMPLETE. {directive(client, 1, total)}")


def filler(step: int) -> str:
    rng = random.Random(step)
    target = rng.randint(1_000, 3_000)  # tokens; a log line below is about 21
    lines = [f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
             f"INFO step{step} {rng.choice(WORDS)}: " + " ".join(rng.choices(WORDS, k=10))
             for _ in range(target // 21)]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    client, step, total = argv[0], int(argv[1]), int(argv[2])
    print(f"step {step} of {total}")
    print(filler(step))
    if step >= total:
        print(f"CHAIN COMPLETE after {total} steps")
    else:
        print(f"next: {directive(client, step + 1, total)}")


if __name__ == "__main__":
    main(sys.argv[1:])
