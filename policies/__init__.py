"""Palimpsest's functional core: pure functions over OpenAI chat message lists.

Messages and a ``Policy`` in, messages and stats out; no I/O, no clocks, no module state. The
only stateful objects (``TokenCounter``, ``Calibration``) are created by the shell and passed in.
"""

from policies.compaction import CheckpointMark, CompactionStats, PlanEvent, compact_tool_results, plan_view, round_sizes, truncate_head_tail
from policies.extraction import extract_exact_values, format_exact_values, merge_state
from policies.policy import PROFILES, Policy, PolicyOverride, ToolRule, resolve_policy
from policies.hidden_index import render_hidden_index
from policies.projection import project_view, render_summary_block
from policies.recall_tools import is_recall_call, recall_note, recall_tool_names, recall_tools
from policies.rounds import choose_boundary, last_user_index, split_rounds, tool_pair_problems
from policies.summary import (
    DEFAULT_SUMMARY_PROMPT,
    REQUIRED_SECTIONS,
    chunk_messages,
    format_transcript,
    redact,
    render_fork_instruction,
    render_forked_summary_request,
    render_summary_request,
    validate_summary,
)
from policies.tailoring import ContextOverflow, TailorStats, tailor
from policies.tokens import Calibration, TokenCounter

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "PROFILES",
    "REQUIRED_SECTIONS",
    "Calibration",
    "CompactionStats",
    "PlanEvent",
    "ContextOverflow",
    "Policy",
    "PolicyOverride",
    "TailorStats",
    "TokenCounter",
    "ToolRule",
    "choose_boundary",
    "chunk_messages",
    "compact_tool_results",
    "CheckpointMark",
    "plan_view",
    "round_sizes",
    "extract_exact_values",
    "format_exact_values",
    "format_transcript",
    "is_recall_call",
    "last_user_index",
    "merge_state",
    "project_view",
    "recall_note",
    "recall_tool_names",
    "recall_tools",
    "redact",
    "render_fork_instruction",
    "render_forked_summary_request",
    "render_hidden_index",
    "render_summary_block",
    "render_summary_request",
    "resolve_policy",
    "split_rounds",
    "tailor",
    "tool_pair_problems",
    "truncate_head_tail",
    "validate_summary",
]
