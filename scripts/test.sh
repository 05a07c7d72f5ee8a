#!/usr/bin/env bash
# The test command of README.md: starts what the tests need (a private
# redis-server on a free loopback port, installed from Debian's packages
# when missing), runs every test with the race detector, and stops what it
# started. Extra arguments go to `go test` (e.g. -run Redis -v).
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
# Keep Caddy's autosave and the persisted backend sets out of $HOME.
export XDG_DATA_HOME="$tmp/data" XDG_CONFIG_HOME="$tmp/config"

eval "$(bash scripts/redis-test-server.sh)"
trap 'kill "$SLUICE_TEST_REDIS_PID" 2>/dev/null || true; rm -rf "$tmp"' EXIT
echo "test redis at $SLUICE_TEST_REDIS_ADDR (pid $SLUICE_TEST_REDIS_PID)"

go test -race -count=1 "$@" ./...
