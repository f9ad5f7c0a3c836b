#!/usr/bin/env bash
# Throwaway PostgreSQL for the batch size optimizer tests and benchmark.
#
#   .ci/postgres.sh [start]   install (Debian packages) if missing, start a cluster on
#                             127.0.0.1:$ZEUS_PG_PORT (default 55432) with its data under
#                             $ZEUS_PG_DATA (default /tmp/zeus-bso-pg), create database
#                             $ZEUS_PG_DB (default zeus_bso) and print its URL on stdout:
#                             postgresql+asyncpg://postgres@127.0.0.1:55432/zeus_bso
#   .ci/postgres.sh stop      stop the cluster and delete its data directory
#   .ci/postgres.sh url       print the URL only
#
# Typical use:  export ZEUS_BSO_TEST_POSTGRES_URL="$(.ci/postgres.sh)"
# Runs as root: initdb/pg_ctl run as the `postgres` user. Logs go to stderr, only the URL to
# stdout. Authentication is `trust` on the loopback interface: never expose this cluster.
set -euo pipefail

PORT="${ZEUS_PG_PORT:-55432}"
DATA="${ZEUS_PG_DATA:-/tmp/zeus-bso-pg}"
DB="${ZEUS_PG_DB:-zeus_bso}"
URL="postgresql+asyncpg://postgres@127.0.0.1:${PORT}/${DB}"

log() { echo "[postgres.sh] $*" >&2; }

find_bin() {
    local d
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

cmd="${1:-start}"
case "$cmd" in
url)
    echo "$URL"
    exit 0
    ;;
stop)
    BIN="$(find_bin)" || { log "PostgreSQL is not installed"; exit 0; }
    if [ -f "$DATA/PG_VERSION" ]; then
        as_postgres "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
        rm -rf "$DATA"
    fi
    exit 0
    ;;
start) ;;
*)
    log "unknown command '$cmd' (start|stop|url)"
    exit 2
    ;;
esac

BIN="$(find_bin || true)"
if [ -z "$BIN" ]; then
    log "installing PostgreSQL from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y --no-install-recommends postgresql >&2
    BIN="$(find_bin)"
fi
if ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
    mkdir -p "$DATA"
    chown postgres: "$DATA"
    chmod 700 "$DATA"
    log "initdb $DATA"
    as_postgres "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 >&2
fi

if as_postgres "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "already running"
else
    log "starting on 127.0.0.1:$PORT"
    as_postgres "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA -c max_connections=200" start >&2
fi

if ! as_postgres "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
    as_postgres "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi
echo "$URL"
