#!/usr/bin/env bash
# Starts a private, throw-away redis-server on a free loopback port for tests
# and prints the variables the Go tests read:
#
#   eval "$(scripts/redis-test-server.sh)"
#   go test ./lb/redisleast/
#   kill "$SLUICE_TEST_REDIS_PID"; rm -rf "$SLUICE_TEST_REDIS_DIR"
#
# No persistence, bound to 127.0.0.1 only. Installs the Debian package when
# redis-server is missing (CI runs as root). Diagnostics go to stderr, so
# only the export lines reach eval.
set -euo pipefail

log() { echo "redis-test-server: $*" >&2; }

if ! command -v redis-server >/dev/null 2>&1; then
	log "redis-server not found; installing the redis-server package"
	if [ "$(id -u)" -ne 0 ]; then
		log "not root: install redis-server (apt-get install redis-server) and retry"
		exit 1
	fi
	apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >&2
fi

# port_free N: true when nothing listens on 127.0.0.1:N.
port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-redis.XXXXXX")
timeout_s=${SLUICE_REDIS_START_TIMEOUT:-10}

for attempt in $(seq 1 20); do
	port=$((20000 + RANDOM % 40000))
	port_free "$port" || continue
	if ! redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
		--daemonize yes --dir "$dir" --pidfile "$dir/redis.pid" \
		--logfile "$dir/redis.log" >&2; then
		continue
	fi
	deadline=$((SECONDS + timeout_s))
	while [ "$SECONDS" -lt "$deadline" ]; do
		if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ] && [ -s "$dir/redis.pid" ]; then
			echo "export SLUICE_TEST_REDIS_ADDR=127.0.0.1:$port; export SLUICE_TEST_REDIS_PID=$(cat "$dir/redis.pid"); export SLUICE_TEST_REDIS_DIR=$dir"
			exit 0
		fi
		sleep 0.1
	done
	# Lost a race for the port, or it is slow: stop what we started and retry.
	if [ -s "$dir/redis.pid" ]; then
		kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
	fi
	log "no answer on port $port within ${timeout_s}s (attempt $attempt); log: $dir/redis.log"
	tail -n 5 "$dir/redis.log" >&2 2>/dev/null || true
	rm -f "$dir/redis.pid"
done
log "could not start redis-server on a free loopback port after 20 attempts"
rm -rf "$dir"
exit 1
