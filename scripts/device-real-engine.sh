#!/usr/bin/env bash
# The real-engine checks of issue 19 for a session lent a GPU machine (the
# device tool: no Go there, nothing to download, 10 minutes a command, about
# 15 minutes of device time a session). Everything is built here first;
# each check is then one call there, with the binaries carried along.
#
#   here:   bash scripts/device-real-engine.sh prepare
#           (linux/amd64 Caddy and sluice-bench, stripped and gzipped, in
#           .device/, ignored by git; about 26 MB of the 64 MiB a call
#           carries)
#   there:  run  command="bash scripts/device-real-engine.sh r4"  carry=[".device"]  timeout_s=600
#           run  command="bash scripts/device-real-engine.sh r1"  carry=[".device"]  timeout_s=600
#           run  command="bash scripts/device-real-engine.sh calibrate"  carry=[".device"]  timeout_s=600
#
# r4: four replicas of bench/realengine/server.py (transformers continuous
#     batching, a 3B Llama-shaped model with random weights) on the one GPU,
#     9 req/s, the measured workload: round robin, queued_least_latency,
#     load_aware and cache_aware with defaults, and the prefix-hash oracle
#     (all of issue 19's four-replica must-show; about 6 minutes with the
#     models' start).
# r4-more: the same for least_conn and flow_control.
# r1: one replica at 4 and 8 req/s: direct against each Sluice policy
#     (queued_least_latency's old defaults made it 15x slower than direct;
#     about 6 minutes).
# calibrate: direct to one replica at 4, 8, 12 req/s, next to the measured
#     H100 run in ../shared/real-engine (the simulator's calibration).
# global_redis_least is left out: no Redis there. The order above is the
# order of value: r4 and r1 fit one session's device time together.
# Results (md, csv, json, svg) go to $OUT (the device tool brings them
# back); commit them under bench/results/ with the machine named.
#
# SLUICE_DEVICE_ENGINE=sim runs the same commands on the simulator, here,
# at scale 0.25: a check of this script, not a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
prepare)
	mkdir -p .device
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags '-s -w' -o .device/caddy ./cmd/caddy
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags '-s -w' -o .device/sluice-bench ./cmd/sluice-bench
	gzip -9f .device/caddy .device/sluice-bench
	git rev-parse HEAD >.device/commit
	ls -l .device
	exit 0
	;;
r1 | r4 | r4-more | calibrate) ;;
*)
	echo "usage: $0 prepare | r4 | r1 | r4-more | calibrate" >&2
	exit 2
	;;
esac

if [ ! -f .device/caddy.gz ] || [ ! -f .device/sluice-bench.gz ]; then
	echo "no .device/caddy.gz or .device/sluice-bench.gz: run '$0 prepare' here and carry .device" >&2
	exit 2
fi
out=${OUT:-/tmp/sluice-device-out}
bin=$(mktemp -d /tmp/sluice-device.XXXXXX)
trap 'rm -rf "$bin"' EXIT # the unpacked binaries (76 MB)
mkdir -p "$out"
gunzip -c .device/caddy.gz >"$bin/caddy"
gunzip -c .device/sluice-bench.gz >"$bin/sluice-bench"
chmod +x "$bin/caddy" "$bin/sluice-bench"
echo "binaries of commit $(cat .device/commit 2>/dev/null || echo unknown); working tree at $(git rev-parse HEAD 2>/dev/null || echo unknown)"

engine=${SLUICE_DEVICE_ENGINE:-transformers}
if [ "$engine" = transformers ]; then
	nvidia-smi -L || true
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
fi
common=(-engine "$engine" -caddy "$bin/caddy" -no-install -timeout 9m -out "$out")
set -x
case "$mode" in
r4)
	"$bin/sluice-bench" real-engine "${common[@]}" -replicas 4 -rates 9 -only 'round_robin,queued,load_aware,cache_aware,header'
	;;
r4-more)
	"$bin/sluice-bench" real-engine "${common[@]}" -replicas 4 -rates 9 -only 'least_conn,flow_control'
	;;
r1)
	"$bin/sluice-bench" real-engine "${common[@]}" -replicas 1 -rates 4,8 -only 'direct,queued,load_aware,cache_aware,flow_control'
	;;
calibrate)
	"$bin/sluice-bench" real-engine "${common[@]}" -calibrate
	;;
esac
