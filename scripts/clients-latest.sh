#!/usr/bin/env bash
# The client compatibility suites against the newest release of every client, instead of the
# pinned versions, each in an install of its own (.clients/ and the project's venv are not
# touched):
# - the Python libraries of pyproject.toml's `clients` extra, in .venv-clients-latest/;
# - the npm packages of tests/support/cli-packages.txt (the coding-agent CLIs, the Vercel AI SDK,
#   the openai / anthropic Node SDKs) at their `latest` tag, in .clients-latest/, which the tests
#   use through PALIMPSEST_CLIENTS (tests/support/clis.py, tests/clients/node_run.py look there
#   first). Qwen Code stays at its pin: its releases from 0.21 on need Node >= 22.
# Runs tests/clients and the tests that drive the real CLIs. Run it before moving the pins; a
# failure here is a client release that would break users. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-clients-latest
.venv-clients-latest/bin/pip install -q --upgrade pip
.venv-clients-latest/bin/pip install -q -e '.[test]'
.venv-clients-latest/bin/pip install -q --upgrade openai openai-agents langchain-openai langgraph 'pydantic-ai-slim[openai]' litellm
.venv-clients-latest/bin/pip list 2>/dev/null | grep -iE '^(openai|openai-agents|langchain-openai|langgraph|pydantic-ai-slim|litellm) '

held="@qwen-code/qwen-code"  # needs a newer Node than the one the tests run on (see above)
latest=()
while read -r spec; do
    [ -n "$spec" ] || continue
    name="${spec%@*}"
    if [ "$name" = "$held" ]; then latest+=("$spec"); else latest+=("$name@latest"); fi
done < tests/support/cli-packages.txt
npm install --prefix .clients-latest --no-audit --no-fund --loglevel=error "${latest[@]}"
for spec in "${latest[@]}"; do
    name="${spec%@*}"
    echo "$name $(node -p "require('./.clients-latest/node_modules/$name/package.json').version")"
done

export PALIMPSEST_CLIENTS="$PWD/.clients-latest"
exec .venv-clients-latest/bin/python -m pytest -q tests/clients tests/simulator/test_cli_chains.py \
    tests/messages/test_claude_code.py tests/responses/test_codex_cli.py tests/chat/test_qwen_code.py "$@"
