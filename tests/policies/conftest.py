"""Shared fixtures for the policy tests."""

import pytest

from policies.tokens import TokenCounter


@pytest.fixture
def counter() -> TokenCounter:
    # Fresh cache per test (tests reuse event ids); tiktoken itself caches the loaded encoding.
    return TokenCounter()
