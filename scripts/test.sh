#!/usr/bin/env bash
# The test command of README.md: starts what the tests need (a private
# redis-server on a free loopback port, installed from Debian's packages
# when missing, and a private 3-master Redis Cluster), runs every test
# with the race detector, and stops what it started. Extra arguments go
# to `go test` (e.g. -run Redis -v).
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
# Keep Caddy's autosave and the persisted backend sets out of $HOME.
export XDG_DATA_HOME="$tmp/data" XDG_CONFIG_HOME="$tmp/config"

# The benchmark harness's smoke test compares against HAProxy.
if ! command -v haproxy >/dev/null 2>&1; then
	if [ "$(id -u)" -eq 0 ]; then
		echo "installing haproxy (Debian package) for the benchmark harness test" >&2
		apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y haproxy >&2
	else
		echo "haproxy is missing and this is not root: the harness test will skip (or fail under CI=true)" >&2
	fi
fi

# stop_and_wait PID...: SIGTERM, then up to 10 s until each is gone (or a
# zombie left for init to reap), then SIGKILL for what is left. A Redis
# node writes its log, and a cluster node its config, as it shuts down:
# its directory removed before that, rm failed with "Directory not empty"
# and the whole run with it, every test passed.
stop_and_wait() {
	[ $# -gt 0 ] || return 0
	kill "$@" 2>/dev/null || true
	local deadline=$((SECONDS + 10)) p st left
	while :; do
		left=()
		for p in "$@"; do
			st=$(ps -o stat= -p "$p" 2>/dev/null || true)
			if [ -n "$st" ] && [ "${st:0:1}" != Z ]; then left+=("$p"); fi
		done
		[ ${#left[@]} -eq 0 ] && return 0
		if [ "$SECONDS" -ge "$deadline" ]; then
			kill -9 "${left[@]}" 2>/dev/null || true
			return 0
		fi
		sleep 0.1
	done
}

# cleanup stops the Redis servers this run started and removes what it
# wrote; it never changes the run's outcome.
cleanup() {
	stop_and_wait "$SLUICE_TEST_REDIS_PID" ${SLUICE_TEST_REDIS_CLUSTER_PIDS:-}
	rm -rf "$tmp" "$SLUICE_TEST_REDIS_DIR" "${SLUICE_TEST_REDIS_CLUSTER_DIR:-}" ||
		echo "test.sh: could not remove every test Redis directory" >&2
}

eval "$(bash scripts/redis-test-server.sh)"
trap cleanup EXIT
echo "test redis at $SLUICE_TEST_REDIS_ADDR (pid $SLUICE_TEST_REDIS_PID)"
# A 3-master Redis Cluster: every Redis-backed feature is tested against
# it as well (redistest.Targets; under CI=true a missing cluster fails).
eval "$(bash scripts/redis-cluster-test.sh)"
echo "test redis cluster at $SLUICE_TEST_REDIS_CLUSTER_ADDRS (pids $SLUICE_TEST_REDIS_CLUSTER_PIDS)"

# llm-d-inference-sim, an engine simulator that publishes KV-cache events
# like vLLM: the kv_events tests run against it (built once into a cache).
if [ -z "${SLUICE_LLMD_SIM:-}" ]; then
	if sim=$(bash scripts/llmd-sim.sh); then
		export SLUICE_LLMD_SIM="$sim"
	elif [ "${CI:-}" = true ]; then
		echo "building llm-d-inference-sim failed: the kv_events tests need it" >&2
		exit 1
	else
		echo "llm-d-inference-sim could not be built: the kv_events tests against it will skip" >&2
	fi
fi

go test -race -count=1 "$@" ./...

# A short run of every fuzz target of outside input (the committed corpora
# under testdata/fuzz already ran above as seeds). Skipped when arguments
# select tests. Each run is a count of executions (about three seconds' worth
# on a 2-core box), not a duration: Go before 1.27 can fail a duration run
# with a bare "context deadline exceeded" as -fuzztime expires, a race in its
# fuzz coordinator (go.dev/issue/75804) that reported no input and failed CI.
# SLUICE_FUZZTIME overrides every target's budget (e.g. 60s or 1000000x).
if [ $# -eq 0 ]; then
	for target in "FuzzSetBackendsBody ./caddymodule 4000x" "FuzzTrustedFlowHeaders ./caddymodule 7000x" \
		"FuzzCaddyfileOptions ./caddymodule 2000x" "FuzzFirstByteLimit ./caddymodule 9000x" \
		"FuzzParseBackend ./lb 200000x" "FuzzExtractMatchesEncodingJSON ./lb/reqtext 100000x" \
		"FuzzDigestMatchesEncodingJSON ./lb/reqtext 30000x" \
		"FuzzDecode ./lb/kvevents 50000x" "FuzzParse ./lb/modelmetrics 30000x"; do
		set -- $target
		echo "fuzz $1 ($2), ${SLUICE_FUZZTIME:-$3}"
		go test -run '^$' -fuzz "^$1\$" -fuzztime "${SLUICE_FUZZTIME:-$3}" "$2"
	done
fi
