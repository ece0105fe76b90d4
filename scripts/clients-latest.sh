#!/usr/bin/env bash
# The client compatibility suite (tests/clients) against the newest release of every client,
# instead of the versions pinned in pyproject.toml's `clients` extra, in a virtualenv of its own.
# Run it before moving the pins; a failure here is a client release that would break users.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-clients-latest
.venv-clients-latest/bin/pip install -q --upgrade pip
.venv-clients-latest/bin/pip install -q -e '.[test]'
.venv-clients-latest/bin/pip install -q --upgrade openai openai-agents langchain-openai langgraph 'pydantic-ai-slim[openai]' litellm
.venv-clients-latest/bin/pip list 2>/dev/null | grep -iE '^(openai|openai-agents|langchain-openai|langgraph|pydantic-ai-slim|litellm) '
exec .venv-clients-latest/bin/python -m pytest -q tests/clients "$@"
