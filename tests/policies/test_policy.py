"""Tests for policies/policy.py."""

import pytest
from pydantic import ValidationError

from policies.policy import Policy, PolicyOverride, ToolRule, resolve_policy


def test_defaults_match_the_design():
    policy = Policy()
    assert policy.profile == "balanced" and policy.keep_recent_rounds == 2
    assert (policy.summary_trigger_ratio, policy.sync_compaction_ratio) == (0.75, 0.85)
    assert (policy.compact_trigger_ratio, policy.view_target_ratio) == (0.65, 0.1)
    assert policy.injection == "system" and policy.recall is True
    assert policy.truncate_last_message is False
    assert policy.tool_rules == {} and policy.summary_model is None
    assert any("AKIA" in p for p in policy.redact_patterns)


def test_every_field_explains_itself():
    for name, field in Policy.model_fields.items():
        assert field.description, name


def test_policy_is_frozen_and_rejects_unknown_keys():
    policy = Policy()
    with pytest.raises(ValidationError):
        policy.keep_recent_rounds = 5
    with pytest.raises(ValidationError, match="keep_recent_round"):
        Policy(keep_recent_round=2)


@pytest.mark.parametrize("field", ["summary_trigger_ratio", "sync_compaction_ratio", "summary_required_values_ratio"])
@pytest.mark.parametrize("value", [0, -0.1, 1.5])
def test_ratios_must_be_in_unit_interval(field, value):
    with pytest.raises(ValidationError) as info:
        Policy(**{field: value, "summary_trigger_ratio": 0.5} if field != "summary_trigger_ratio" else {field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_sync_ratio_not_below_trigger():
    with pytest.raises(ValidationError, match=r"sync_compaction_ratio.*0\.4"):
        Policy(summary_trigger_ratio=0.6, sync_compaction_ratio=0.4)
    assert Policy(summary_trigger_ratio=0.6, sync_compaction_ratio=0.6)


def test_bad_regex_is_named():
    with pytest.raises(ValidationError, match=r"redact_patterns.*\(unclosed"):
        Policy(redact_patterns=["(unclosed"])


def test_tool_rule_first_glob_match_wins():
    policy = Policy(tool_rules={"read_*": {"action": "keep"}, "*": ToolRule(action="clean")})
    assert policy.tool_rule("read_file").action == "keep"
    assert policy.tool_rule("bash").action == "clean"
    assert Policy().tool_rule("bash") is None


def test_override_accepts_flat_toml_shape():
    override = PolicyOverride.model_validate({"model": "gpt-4o*", "session": "ci-*", "keep_recent_rounds": 2})
    assert override.policy == {"keep_recent_rounds": 2}
    assert override.model == "gpt-4o*" and override.session == "ci-*"


def test_override_rejects_unknown_field_and_bad_value_by_name():
    with pytest.raises(ValidationError, match="keep_recent_roundz"):
        PolicyOverride.model_validate({"model": "*", "keep_recent_roundz": 2})
    with pytest.raises(ValidationError, match="keep_recent_rounds"):
        PolicyOverride.model_validate({"model": "*", "keep_recent_rounds": "many"})


def test_resolve_applies_matching_overrides_in_order():
    base = Policy()
    overrides = [
        PolicyOverride(model="gpt-4o*", policy={"keep_recent_rounds": 2, "injection": "user"}),
        PolicyOverride(session="ci-*", policy={"keep_recent_rounds": 5}),
        PolicyOverride(model="claude*", policy={"recall": False}),
    ]
    both = resolve_policy(base, overrides, "gpt-4o-mini", "ci-42")
    assert both.keep_recent_rounds == 5 and both.injection == "user" and both.recall is True
    only_model = resolve_policy(base, overrides, "gpt-4o", "dev-1")
    assert only_model.keep_recent_rounds == 2


def test_resolve_returns_base_itself_when_nothing_matches():
    base = Policy()
    never = PolicyOverride(policy={"keep_recent_rounds": 9})  # no glob: never matches
    assert resolve_policy(base, [never], "gpt-4o", "s") is base


def test_override_needs_both_globs_to_match():
    override = PolicyOverride(model="gpt-4o*", session="ci-*", policy={"keep_recent_rounds": 1})
    assert resolve_policy(Policy(), [override], "gpt-4o", "dev").keep_recent_rounds == Policy().keep_recent_rounds


def test_resolved_policy_is_validated_against_the_base():
    base = Policy(summary_trigger_ratio=0.6, sync_compaction_ratio=0.8)
    override = PolicyOverride(model="*", policy={"sync_compaction_ratio": 0.55})
    with pytest.raises(ValidationError, match="sync_compaction_ratio"):
        resolve_policy(base, [override], "m", "s")


def test_override_tool_rules_become_rules():
    override = PolicyOverride.model_validate({"model": "*", "tool_rules": {"bash": {"action": "clean"}}})
    assert resolve_policy(Policy(), [override], "m", "s").tool_rule("bash").action == "clean"


def test_profiles_are_bundles_of_keys_and_explicit_keys_win():
    economy, balanced, fidelity = (Policy(profile=p) for p in ("economy", "balanced", "fidelity"))
    for key in ("summary_trigger_ratio", "sync_compaction_ratio", "keep_recent_share", "view_target_ratio"):
        assert getattr(economy, key) < getattr(balanced, key) < getattr(fidelity, key), key
    assert economy.keep_recent_tokens == 8000 and economy.keep_recent_share == 0.05
    mixed = Policy(profile="economy", view_target_ratio=0.3)
    assert mixed.view_target_ratio == 0.3 and mixed.summary_trigger_ratio == 0.3
    with pytest.raises(ValidationError, match="profile"):
        Policy(profile="cheap")
    with pytest.raises(ValidationError, match="view_target_ratio"):
        Policy(view_target_ratio=0.7)  # above the balanced compaction trigger


def test_override_can_switch_profile():
    base = Policy(summary_model="m")
    override = PolicyOverride(model="big-*", profile="fidelity", keep_recent_rounds=5)
    resolved = resolve_policy(base, [override], "big-1", "s")
    assert resolved.profile == "fidelity" and resolved.summary_trigger_ratio == 0.85
    assert resolved.keep_recent_rounds == 5 and resolved.summary_model == "m"
    assert resolve_policy(base, [override], "small", "s") is base
