#!/usr/bin/env bash
# Starts a private, throw-away Redis Cluster of 3 masters (no replicas) on
# free loopback ports for tests and prints the variables the Go tests read:
#
#   eval "$(scripts/redis-cluster-test.sh)"
#   go test ./lb/redisleast/
#   kill $SLUICE_TEST_REDIS_CLUSTER_PIDS; rm -rf "$SLUICE_TEST_REDIS_CLUSTER_DIR"
#
# No persistence, bound to 127.0.0.1 only; the nodes' cluster config files
# live in a temporary directory. Needs redis-server and redis-cli (install
# them with scripts/redis-test-server.sh, which runs first in
# scripts/test.sh). Diagnostics go to stderr, so only the export lines
# reach eval. On failure it stops every node it started.
set -euo pipefail

log() { echo "redis-cluster-test: $*" >&2; }

for cmd in redis-server redis-cli; do
	if ! command -v "$cmd" >/dev/null 2>&1; then
		log "$cmd not found (apt-get install redis-server)"
		exit 1
	fi
done

# port_free N: true when nothing listens on 127.0.0.1:N nor on its cluster
# bus port N+10000.
port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null &&
		! (exec 3<>"/dev/tcp/127.0.0.1/$(($1 + 10000))") 2>/dev/null
}

dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-redis-cluster.XXXXXX")
timeout_s=${SLUICE_REDIS_START_TIMEOUT:-10}
nodes=3
pids=()
addrs=()

cleanup_failed() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	log "logs kept in $dir"
}

# start_node: starts one cluster-enabled node on a free port (ports below
# 55536, so the bus port N+10000 is valid), appends its pid and address.
start_node() {
	local i=$1 attempt port ndir deadline
	for attempt in $(seq 1 20); do
		port=$((20000 + RANDOM % 35000))
		port_free "$port" || continue
		ndir="$dir/node$i-$port"
		mkdir -p "$ndir"
		if ! redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
			--cluster-enabled yes --cluster-config-file "$ndir/nodes.conf" \
			--cluster-node-timeout 5000 \
			--daemonize yes --dir "$ndir" --pidfile "$ndir/redis.pid" \
			--logfile "$ndir/redis.log" >&2; then
			continue
		fi
		deadline=$((SECONDS + timeout_s))
		while [ "$SECONDS" -lt "$deadline" ]; do
			if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ] && [ -s "$ndir/redis.pid" ]; then
				pids+=("$(cat "$ndir/redis.pid")")
				addrs+=("127.0.0.1:$port")
				return 0
			fi
			sleep 0.1
		done
		if [ -s "$ndir/redis.pid" ]; then
			kill "$(cat "$ndir/redis.pid")" 2>/dev/null || true
		fi
		log "node $i: no answer on port $port within ${timeout_s}s (attempt $attempt); log: $ndir/redis.log"
		tail -n 5 "$ndir/redis.log" >&2 2>/dev/null || true
	done
	log "node $i: could not start redis-server on a free loopback port after 20 attempts"
	return 1
}

for i in $(seq 1 "$nodes"); do
	if ! start_node "$i"; then
		cleanup_failed
		exit 1
	fi
done

if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1; then
	log "redis-cli --cluster create failed:"
	cat "$dir/create.log" >&2
	cleanup_failed
	exit 1
fi

# Every node must see the whole cluster (all 16384 slots assigned, state
# ok) before a test connects to any of them.
deadline=$((SECONDS + 30))
for a in "${addrs[@]}"; do
	while :; do
		info=$(redis-cli -h "${a%:*}" -p "${a##*:}" cluster info 2>/dev/null | tr -d '\r')
		if grep -q '^cluster_state:ok$' <<<"$info" && grep -q '^cluster_slots_ok:16384$' <<<"$info" &&
			grep -q "^cluster_known_nodes:$nodes\$" <<<"$info"; then
			break
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			log "node $a: cluster not ok within 30s:"
			echo "$info" >&2
			cleanup_failed
			exit 1
		fi
		sleep 0.1
	done
done

log "cluster of $nodes masters ok: ${addrs[*]} (dir $dir)"
echo "export SLUICE_TEST_REDIS_CLUSTER_ADDRS=$(
	IFS=,
	echo "${addrs[*]}"
); export SLUICE_TEST_REDIS_CLUSTER_PIDS=\"${pids[*]}\"; export SLUICE_TEST_REDIS_CLUSTER_DIR=$dir"
