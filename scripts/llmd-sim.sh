#!/usr/bin/env bash
# Builds llm-d-inference-sim (the version pinned in build/llmd-sim/go.mod, a
# separate module so its dependencies stay out of Sluice's go.mod) into a
# cache directory, once, and prints the binary's path. The KV-events tests
# run it when SLUICE_LLMD_SIM names it:
#
#   export SLUICE_LLMD_SIM="$(bash scripts/llmd-sim.sh)"
#
# Pure Go with its dummy tokenizer (--force-dummy-tokenizer): no cgo.
set -euo pipefail
cd "$(dirname "$0")/../build/llmd-sim"

version=$(go list -m -f '{{.Version}}' github.com/llm-d/llm-d-inference-sim)
[ -n "$version" ] || { echo "llmd-sim: no pinned version in build/llmd-sim/go.mod" >&2; exit 1; }
cache="${SLUICE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-tools}"
bin="$cache/llm-d-inference-sim-$version"

if [ ! -x "$bin" ]; then
	mkdir -p "$cache"
	echo "llmd-sim: building llm-d-inference-sim $version into $cache (once)" >&2
	CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" go build -trimpath -o "$bin.tmp" \
		github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim >&2
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
