#!/usr/bin/env bash
# Prometheus and its Pushgateway for the zeus.metric and exporter tests.
#
#   .ci/prometheus.sh [install]   install Debian's `prometheus` (prometheus, promtool) and
#                                 `prometheus-pushgateway` if missing, make sure the packages'
#                                 own services are not running, and print on stdout:
#                                   export ZEUS_TEST_PROMETHEUS=/usr/bin/prometheus
#                                   export ZEUS_TEST_PUSHGATEWAY=/usr/bin/prometheus-pushgateway
#   .ci/prometheus.sh stop        stop the packages' services (if any were started)
#
# Typical use:  eval "$(.ci/prometheus.sh)"
# The tests start their own servers on free loopback ports with throwaway data directories
# (tests/prometheus_servers.py); nothing here listens on a port. Without the variables the tests
# look the binaries up on PATH and skip when they are absent. Runs as root (apt-get); logs go to
# stderr, only the export lines to stdout.
set -euo pipefail

log() { echo "[prometheus.sh] $*" >&2; }

# Debian names the Pushgateway binary after its package; upstream calls it `pushgateway`.
find_prometheus() { command -v prometheus || true; }
find_promtool() { command -v promtool || true; }
find_pushgateway() { command -v prometheus-pushgateway || command -v pushgateway || true; }

# The packages ship init scripts (and systemd units) that start servers on the default ports
# 9090/9091/9100; the tests never want those.
SERVICES=(prometheus prometheus-pushgateway prometheus-node-exporter)

stop_services() {
    local s
    for s in "${SERVICES[@]}"; do
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            if systemctl is-active --quiet "$s" 2>/dev/null; then
                log "stopping and disabling the $s service"
                systemctl stop "$s" >&2 || true
                systemctl disable "$s" >&2 2>/dev/null || true
            fi
        elif [ -x "/etc/init.d/$s" ]; then
            if "/etc/init.d/$s" status >/dev/null 2>&1; then
                log "stopping the $s service"
                "/etc/init.d/$s" stop >&2 || true
            fi
        fi
    done
}

check_ports() {
    command -v ss >/dev/null 2>&1 || return 0
    local port
    for port in 9090 9091 9100; do
        if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
            log "warning: something still listens on port $port (not started by this script?)"
        fi
    done
}

install_packages() {
    local missing=()
    [ -n "$(find_prometheus)" ] && [ -n "$(find_promtool)" ] || missing+=(prometheus)
    [ -n "$(find_pushgateway)" ] || missing+=(prometheus-pushgateway)
    [ "${#missing[@]}" -eq 0 ] && return 0

    log "installing ${missing[*]} from Debian packages"
    # Keep the packages' maintainer scripts from starting their services: invoke-rc.d asks
    # policy-rc.d, and 101 means "action not allowed". Containers usually have one already.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
    fi
    local rc=0
    {
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 &&
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    } || rc=$?
    [ "$created_policy" -eq 1 ] && rm -f "$policy"
    [ "$rc" -eq 0 ] || { log "apt-get failed ($rc)"; exit "$rc"; }
}

cmd="${1:-install}"
case "$cmd" in
stop)
    stop_services
    exit 0
    ;;
install) ;;
*)
    log "unknown command '$cmd' (install|stop)"
    exit 2
    ;;
esac

install_packages
stop_services
check_ports

PROM="$(find_prometheus)"
PROMTOOL="$(find_promtool)"
PUSHGW="$(find_pushgateway)"
for b in "$PROM" "$PROMTOOL" "$PUSHGW"; do
    [ -n "$b" ] || { log "a binary is still missing after the install"; exit 1; }
done
log "prometheus:   $PROM ($("$PROM" --version 2>&1 | head -n 1))"
log "promtool:     $PROMTOOL"
log "pushgateway:  $PUSHGW ($("$PUSHGW" --version 2>&1 | head -n 1))"
echo "export ZEUS_TEST_PROMETHEUS=$PROM"
echo "export ZEUS_TEST_PUSHGATEWAY=$PUSHGW"
