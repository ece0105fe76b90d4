#!/usr/bin/env bash
# Set up a virtualenv with the project, its test extras and the pinned clients of tests/clients,
# then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test,clients]'
exec .venv/bin/python -m pytest -q "$@"
