#!/usr/bin/env bash
# Install the peer gateways that bench/overhead.py compares against, each in its own
# virtualenv so their dependency trees never touch the project's.
#
#   bash bench/peers.sh            # both peers
#   bash bench/peers.sh litellm    # just one
#
# Idempotent: a peer whose pinned version is already installed is skipped.
# PEERS_ROOT overrides the install root (default /opt/palimpsest-peers).
set -euo pipefail

PEERS_ROOT="${PEERS_ROOT:-/opt/palimpsest-peers}"
PYTHON="${PEERS_PYTHON:-$(command -v python3.11 || command -v python3)}"
LITELLM_VERSION="${LITELLM_VERSION:-1.108.7}"
HEADROOM_VERSION="${HEADROOM_VERSION:-0.42.0}"

log() { printf '[peers] %s\n' "$*" >&2; }

# install_peer NAME DIST VERSION EXTRAS
install_peer() {
    local name="$1" dist="$2" version="$3" extras="$4"
    local venv="$PEERS_ROOT/$name"
    # "Installed" means the pinned version AND the proxy extra's server (fastapi) import.
    if [[ -x "$venv/bin/python" ]] \
        && [[ "$("$venv/bin/python" -m pip show "$dist" 2>/dev/null)" == *$'\nVersion: '"$version"$'\n'* ]] \
        && "$venv/bin/python" -c "import fastapi" 2>/dev/null; then
        log "$name: $dist $version already installed in $venv"
        return 0
    fi
    log "$name: setting up $venv with $PYTHON"
    mkdir -p "$PEERS_ROOT"
    [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    log "$name: installing $dist$extras==$version"
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$dist$extras==$version"; then
        # The pin may have been yanked or never published: take the newest release instead and
        # say so, rather than leaving the benchmark without the peer.
        log "$name: $dist==$version not installable; falling back to the newest $dist"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$dist$extras"
    fi
    log "$name: installed $("$venv/bin/python" -m pip show "$dist" | grep '^Version:')"
}

want="${1:-all}"
status=0
if [[ "$want" == all || "$want" == litellm ]]; then
    install_peer litellm litellm "$LITELLM_VERSION" "[proxy]" || { log "litellm: install failed"; status=1; }
fi
if [[ "$want" == all || "$want" == headroom ]]; then
    install_peer headroom headroom-ai "$HEADROOM_VERSION" "[proxy]" || { log "headroom: install failed"; status=1; }
fi
exit "$status"
