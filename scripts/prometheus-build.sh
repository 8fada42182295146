#!/usr/bin/env bash
# Builds (or finds cached) Prometheus and promtool from the Go module proxy for the tests that
# scrape a stream worker with a real Prometheus and lint its exposition with
# `promtool check metrics`, and prints the directory that holds them.
#
# Why a wrapper module: a throw-away module requires github.com/prometheus/prometheus at a fixed
# version and builds both commands from that one resolved dependency graph (the versions
# Prometheus' go.mod pins; one download for both). `go install pkg@version` refuses a module whose
# go.mod has replace or exclude directives; v0.316.0's has none, but a version that adds them needs
# them repeated here, in the wrapper's go.mod.
#
# Build tags: `remove_all_sd` leaves only the file and http service discoveries in Prometheus
# (plugins/plugin_*.go are `!remove_all_sd || enable_<name>_sd`): the tests use static targets, and
# dropping the cloud SDKs and client-go cuts its compile from ~730 to ~245 CPU-seconds and its peak
# memory from 3.3 to 1 GB (measured, docs/prometheus.md). promtool imports the
# kubernetes SD directly, so it still compiles client-go. The web UI's assets are not in the module
# (the default `!builtinassets` build serves none); the HTTP API is all the tests use.
#
# Cost on a cold, shared 2-core machine (nothing in the Go caches, download included): 470 s wall,
# ~375 CPU-seconds, 1 GB peak memory (docs/prometheus.md, "Figures"). Binaries are cached under
# ${XDG_CACHE_HOME:-~/.cache}/gpulens/prometheus/v<version>/ and the Go caches under
# ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/ (shared with scripts/kube-build.sh), so later runs pay
# nothing.
set -euo pipefail

. "$(dirname "$0")/go-build-lib.sh"
prom_version=${GPULENS_PROMETHEUS_VERSION:-0.316.0}
dest=$gpulens_cache/prometheus/v$prom_version
cached() { [ -x "$dest/prometheus" ] && [ -x "$dest/promtool" ] && echo "$dest"; }
go_build_begin prometheus-build "the Prometheus tests need it to build prometheus and promtool v$prom_version" cached

log "building prometheus and promtool v$prom_version into $dest (cold: 5-15 min)"

module=github.com/prometheus/prometheus
mkdir -p "$work/src"
(
  cd "$work/src"
  {
    echo "module gpulens.local/prometheus-build"
    echo
    echo "go 1.26"
    echo
    echo "require $module v$prom_version"
  } >go.mod
  go get "$module/cmd/prometheus@v$prom_version" "$module/cmd/promtool@v$prom_version" >&2
  pkg=github.com/prometheus/common/version
  ldflags="-s -w -X $pkg.Version=$prom_version -X $pkg.Revision=v$prom_version \
    -X $pkg.Branch=v$prom_version -X $pkg.BuildUser=gpulens -X $pkg.BuildDate=19700101-00:00:00"
  go build -trimpath -tags remove_all_sd -ldflags "$ldflags" -o "$work/out/prometheus" \
    "$module/cmd/prometheus"
  log "prometheus built"
  go build -trimpath -tags remove_all_sd -ldflags "$ldflags" -o "$work/out/promtool" \
    "$module/cmd/promtool"
  log "promtool built"
)

"$work/out/prometheus" --version >&2
go_build_install "$work/out" "$dest"
echo "$dest"
