#!/usr/bin/env bash
# A local Palimpsest cluster: PostgreSQL (Debian's package), an S3-compatible object store
# (moto's server), nginx with consistent hashing on X-Session-Id, N gateway replicas, and the
# simulated upstream. README "Scale-out"; tests/cluster and bench/cluster.py use it too.
#
#   scripts/cluster.sh up [N]        start everything (N replicas, default 3)
#   scripts/cluster.sh down          stop everything (data kept under $CLUSTER_DIR)
#   scripts/cluster.sh status        what runs where
#   scripts/cluster.sh env           the settings a replica gets (eval-able)
#   scripts/cluster.sh pg up|down    PostgreSQL alone (for the store tests)
#   scripts/cluster.sh replica I start|stop|kill   one gateway replica (kill = kill -9)
#
# Environment: CLUSTER_DIR (default ./.cluster), BASE_PORT (default 18500): PostgreSQL on
# BASE_PORT, moto on +1, the upstream simulator on +2, nginx on +3 (the cluster's entry
# point), replicas on +10, +11, ... UPSTREAM_LATENCY (seconds, default 0), AFFINITY=0 for
# round-robin instead of consistent hashing, REPLICA_ARGS (extra settings as env lines).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(mkdir -p "${CLUSTER_DIR:-$ROOT/.cluster}" && cd "${CLUSTER_DIR:-$ROOT/.cluster}" && pwd)"
BASE_PORT="${BASE_PORT:-18500}"
PG_PORT=$BASE_PORT; S3_PORT=$((BASE_PORT + 1)); UP_PORT=$((BASE_PORT + 2)); LB_PORT=$((BASE_PORT + 3))
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
PG_BIN="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
PG_USER=palimpsest; PG_DB=palimpsest; PG_PASSWORD=palimpsest
BUCKET=palimpsest-index
mkdir -p "$DIR/run" "$DIR/log"

die() { echo "cluster: $*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_port() {  # wait_port PORT NAME [SECONDS]
  local deadline=$((SECONDS + ${3:-30}))
  until "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.5)" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || die "$2 did not open port $1 (logs: $DIR/log)"
    sleep 0.2
  done
}
wait_http() {  # wait_http URL NAME [SECONDS]
  local deadline=$((SECONDS + ${3:-60}))
  until "$PY" -c "import urllib.request,sys; urllib.request.urlopen('$1', timeout=2)" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || die "$2 not ready at $1 (logs: $DIR/log)"
    sleep 0.3
  done
}
stop_pid() {  # stop_pid PIDFILE [SIGNAL]
  if alive "$1"; then
    local pid; pid="$(cat "$1")"
    kill -"${2:-TERM}" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}
# PostgreSQL refuses to run as root: run its tools as the postgres user then.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_url() { echo "postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB"; }

pg_up() {
  [ -x "$PG_BIN/postgres" ] || die "PostgreSQL not installed (apt-get install postgresql)"
  local data="$DIR/pgdata"
  if [ ! -f "$data/PG_VERSION" ]; then
    mkdir -p "$data"; [ "$(id -u)" = 0 ] && chown postgres: "$data" "$DIR/log"
    chmod 700 "$data"
    as_pg test -w "$data" || die "the postgres user cannot write $data: use a CLUSTER_DIR it can reach (not under a 0700 directory)"
    as_pg "$PG_BIN/initdb" -D "$data" -U postgres -A trust --no-sync >"$DIR/log/initdb.log" 2>&1 || die "initdb failed: $DIR/log/initdb.log"
  fi
  [ "$(id -u)" = 0 ] && chown postgres: "$DIR/log"
  if ! as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$DIR/log/postgres.log" -w -t 60 start \
      -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=${PG_FSYNC:-on}" >/dev/null \
      || die "postgres did not start: $DIR/log/postgres.log"
  fi
  "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qtAc \
    "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD'; END IF; END \$\$;" >/dev/null
  "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qtAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1 \
    || "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres -O "$PG_USER" "$PG_DB"
  echo "postgres  $(pg_url)"
}
pg_down() {
  [ -f "$DIR/pgdata/PG_VERSION" ] || return 0
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" -m fast -w stop >/dev/null 2>&1 || true
}

s3_up() {
  if ! alive "$DIR/run/moto.pid"; then
    "$PY" -m moto.server -H 127.0.0.1 -p "$S3_PORT" >"$DIR/log/moto.log" 2>&1 &
    echo $! >"$DIR/run/moto.pid"
  fi
  wait_port "$S3_PORT" moto
  "$PY" - <<EOF
import boto3
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:$S3_PORT", region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
if "$BUCKET" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket="$BUCKET")
EOF
  echo "s3        http://127.0.0.1:$S3_PORT (bucket $BUCKET)"
}

upstream_up() {
  if ! alive "$DIR/run/upstream.pid"; then
    "$PY" -m simulator.puppet --port "$UP_PORT" --latency "${UPSTREAM_LATENCY:-0}" --default-window 32000 \
      >"$DIR/log/upstream.log" 2>&1 &
    echo $! >"$DIR/run/upstream.pid"
  fi
  wait_port "$UP_PORT" upstream
  echo "upstream  http://127.0.0.1:$UP_PORT/v1 (simulator, latency ${UPSTREAM_LATENCY:-0}s)"
}

replica_env() {  # the settings every replica gets, as PALIMPSEST_* variables
  cat <<EOF
PALIMPSEST_UPSTREAM__BASE_URL=http://127.0.0.1:$UP_PORT/v1
PALIMPSEST_STORE__URL=$(pg_url)
PALIMPSEST_RECALL__INDEX_URI=s3://$BUCKET/index
PALIMPSEST_RECALL__INDEX_ENDPOINT=http://127.0.0.1:$S3_PORT
PALIMPSEST_RECALL__INDEX_ACCESS_KEY_ID=testing
PALIMPSEST_RECALL__INDEX_SECRET_ACCESS_KEY=testing
PALIMPSEST_SERVER__ADMIN_TOKEN=${ADMIN_TOKEN:-cluster-admin}
${REPLICA_ARGS:-}
EOF
}

replica() {  # replica I start|stop|kill
  local i="$1" port=$((BASE_PORT + 10 + $1)) pidf="$DIR/run/replica-$1.pid"
  case "$2" in
    start)
      alive "$pidf" && return 0
      mkdir -p "$DIR/replica-$i"
      ( set -a; eval "$(replica_env | sed 's/^/export /')"; set +a
        export PALIMPSEST_STORE__PATH="$DIR/replica-$i"
        exec "$PY" -m gateway serve --host 127.0.0.1 --port "$port" ) >>"$DIR/log/replica-$i.log" 2>&1 &
      echo $! >"$pidf"
      wait_http "http://127.0.0.1:$port/readyz" "replica $i"
      echo "replica $i http://127.0.0.1:$port (pid $(cat "$pidf"))" ;;
    stop) stop_pid "$pidf" TERM ;;
    kill) alive "$pidf" && kill -KILL "$(cat "$pidf")"; rm -f "$pidf" ;;
    *) die "replica I start|stop|kill" ;;
  esac
}

nginx_up() {
  local n="$1" servers="" i
  for i in $(seq 0 $((n - 1))); do servers+="        server 127.0.0.1:$((BASE_PORT + 10 + i)) max_fails=1 fail_timeout=2s;"$'\n'; done
  local balance="hash \$http_x_session_id consistent;"
  [ "${AFFINITY:-1}" = 0 ] && balance="# round-robin: no session affinity"
  sed -e "s|{{BALANCE}}|$balance|" -e "s|{{LISTEN}}|127.0.0.1:$LB_PORT|" -e "s|{{DIR}}|$DIR|g" \
      "$ROOT/deploy/nginx/palimpsest.conf.template" | awk -v s="$servers" '{ if ($0 ~ /{{SERVERS}}/) printf "%s", s; else print }' \
      >"$DIR/nginx.conf"
  if alive "$DIR/run/nginx.pid"; then
    nginx -p "$DIR" -c "$DIR/nginx.conf" -s reload
  else
    nginx -p "$DIR" -c "$DIR/nginx.conf"
  fi
  wait_port "$LB_PORT" nginx
  echo "nginx     http://127.0.0.1:$LB_PORT/v1 ($n replicas, $([ "${AFFINITY:-1}" = 0 ] && echo round-robin || echo 'hash $http_x_session_id consistent'))"
}

up() {
  local n="${1:-${REPLICAS:-3}}"
  command -v nginx >/dev/null || die "nginx not installed (apt-get install nginx)"
  pg_up; s3_up; upstream_up
  echo "$n" >"$DIR/replicas"
  for i in $(seq 0 $((n - 1))); do replica "$i" start; done
  nginx_up "$n"
  echo "cluster up: point clients at http://127.0.0.1:$LB_PORT/v1 with an X-Session-Id header"
}

down() {
  [ -f "$DIR/run/nginx.pid" ] && nginx -p "$DIR" -c "$DIR/nginx.conf" -s quit 2>/dev/null || true
  sleep 0.2; rm -f "$DIR/run/nginx.pid"
  for f in "$DIR"/run/replica-*.pid; do [ -e "$f" ] && stop_pid "$f" TERM; done
  stop_pid "$DIR/run/upstream.pid"; stop_pid "$DIR/run/moto.pid"
  pg_down
  echo "cluster down (data in $DIR)"
}

status() {
  for f in "$DIR"/run/*.pid; do [ -e "$f" ] || continue
    printf '%-12s %s\n' "$(basename "$f" .pid)" "$(alive "$f" && echo "pid $(cat "$f")" || echo dead)"; done
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/pgdata" status >/dev/null 2>&1 && echo "postgres     $(pg_url)" || echo "postgres     down"
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  env) replica_env ;;
  pg) case "${2:-}" in up) pg_up ;; down) pg_down ;; *) die "pg up|down" ;; esac ;;
  s3) case "${2:-up}" in up) s3_up ;; down) stop_pid "$DIR/run/moto.pid" ;; *) die "s3 up|down" ;; esac ;;
  upstream) upstream_up ;;
  nginx) nginx_up "${2:-$(cat "$DIR/replicas" 2>/dev/null || echo 3)}" ;;
  replica) replica "${2:?replica index}" "${3:?start|stop|kill}" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
