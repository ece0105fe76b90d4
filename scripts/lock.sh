#!/usr/bin/env bash
# Refresh requirements.lock: resolve the project and its test extras in a fresh virtualenv and
# pin every package it installed. Run it on a schedule (.ci/refresh-lock) so security releases
# arrive as a reviewed change of the lock, not by surprise on the next install.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q -e '.[test]'
{
    echo "# Pinned versions of palimpsest's dependencies and test extras (scripts/lock.sh writes this)."
    echo "# scripts/test.sh and CI install with it as constraints: pip install -c requirements.lock -e '.[test]'."
    "$work/venv/bin/pip" freeze --exclude-editable | grep -v '^palimpsest'
} > requirements.lock
echo "requirements.lock: $(grep -vc '^#' requirements.lock) pins"
