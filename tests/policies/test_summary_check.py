"""The check a checkpoint passes before it replaces the old one (policies/summary_check.py)."""

from __future__ import annotations

from policies.summary_check import check_summary

USER = ["From now on, never run database migrations against the blue cluster without my written approval.",
        "Step 2: please read file on /srv/app/cache/index.py."]
SUMMARY = """## Goal
- Fix the cache index.
## Constraints and prohibitions
- Do not run DB migrations on the blue cluster without the user's written approval.
## Entities and exact values
- OPS-7731, /srv/app/cache/index.py
## Next step
- read /srv/app/cache/index.py
"""


def check(summary=SUMMARY, state=None, **kw):
    kw.setdefault("covered_state", {"ids": ["OPS-7731"], "paths": ["/srv/app/cache/index.py"]})
    kw.setdefault("overflow_rules", [])
    kw.setdefault("user_texts", USER)
    return check_summary(summary, state if state is not None else {"ids": ["OPS-7731"]}, **kw)


def test_a_faithful_summary_passes_unchanged():
    result = check()
    assert (result.outcome, result.problems, result.summary) == ("passed", (), SUMMARY)


def test_values_lost_from_summary_and_state_go_back_into_the_state():
    result = check(covered_state={"ids": ["OPS-7731", "DEP-58213"], "versions": ["0.30.1"]})
    assert result.outcome == "repaired" and result.problems == ("values",)
    assert result.state["ids"] == ["OPS-7731", "DEP-58213"] and result.state["versions"] == ["0.30.1"]
    assert result.summary == SUMMARY


def test_rules_the_block_cannot_hold_are_quoted_verbatim_under_constraints():
    rule = "Always sign every commit message with \"Reviewed-by: Ada Okafor\"."
    result = check(overflow_rules=[rule, USER[0]])
    assert result.outcome == "repaired" and result.problems == ("rules",)
    lines = result.summary.splitlines()
    at = lines.index("## Constraints and prohibitions")
    assert lines[at + 1:at + 3] == [f"- {rule}", f"- {USER[0]}"]
    # Already quoted: nothing to do.
    assert check(summary=result.summary, overflow_rules=[rule, USER[0]]).outcome == "passed"


def test_an_instruction_the_user_never_gave_is_dropped():
    invented = SUMMARY.replace("## Entities", "- Always deploy straight to production on Fridays.\n## Entities")
    invented += "- The user asked to delete the staging database every night.\n"
    result = check(summary=invented)
    assert result.outcome == "repaired" and result.problems == ("invented",)
    assert "Fridays" not in result.summary and "every night" not in result.summary
    assert "Do not run DB migrations on the blue cluster" in result.summary  # grounded: kept
    # A rule-like line that quotes a tool result outside the constraints claims nothing.
    quoting = SUMMARY + "- Never retry more than 3 times (from the worker's log).\n"
    assert check(summary=quoting, other_texts=["WARN never retry more than 3 times in the worker"]).outcome == "passed"
    # A previous checkpoint's constraint (already checked then) grounds it now.
    kept = check(summary=invented, previous_summary="- Always deploy straight to production on Fridays.")
    assert "Fridays" in kept.summary and "every night" not in kept.summary


def test_a_summary_that_is_mostly_invented_is_refused():
    lines = "\n".join(f"- Never touch the {w} service configuration files again." for w in
                      ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta"))
    result = check(summary=f"## Goal\n- x\n## Constraints and prohibitions\n{lines}\n")
    assert result.outcome == "refused" and "invented" in result.problems
