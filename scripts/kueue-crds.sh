#!/usr/bin/env bash
# Fetches (or finds cached) the CustomResourceDefinitions Kueue ships, from the sigs.k8s.io/kueue
# module on the Go module proxy, for the tests that apply them to the real kube-apiserver. Prints
# the directory that holds them as the last line of stdout (progress goes to stderr):
#
#   <dir>/kueue.x-k8s.io_workloads.yaml    Workload (v1beta1 deprecated, v1beta2 the storage
#   <dir>/kueue.x-k8s.io_*.yaml            version) and Kueue's other kinds, unchanged
#
# They are config/components/crd/bases/*.yaml of the module: the manifests Kueue's release
# installs, generated from its Go types (1.6 MB, the Workload's 1.4 MB of it: the pod template's
# full schema). Nothing is built: `go mod download` fetches the module zip (4.7 MB) into the
# Go module cache shared with the other build scripts, and the CRDs are copied out of it.
# Cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/kueue-v<version>/.
set -euo pipefail

kueue_version=${GPULENS_KUEUE_VERSION:-0.17.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpulens
dest=$cache/kueue-v$kueue_version
marker=kueue.x-k8s.io_workloads.yaml

if [ -s "$dest/$marker" ]; then
  echo "$dest"
  exit 0
fi

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
if ! [ -x "$GO" ]; then
  echo "kueue-crds: the Go toolchain ('go') is not on PATH (nor at $GO); the Kueue tests need it to" \
    "fetch the CRDs of sigs.k8s.io/kueue v$kueue_version from the Go module proxy (Go 1.26 or newer)" >&2
  exit 1
fi
go() { "$GO" "$@"; }

export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS=-buildvcs=false
mkdir -p "$cache"
exec 9>"$cache/kueue.lock"
flock 9
if [ -s "$dest/$marker" ]; then
  echo "$dest"
  exit 0
fi

work=$(mktemp -d "$cache/kueue.XXXXXX")
trap 'rm -rf "$work"' EXIT
log() { echo "kueue-crds: [${SECONDS}s] $*" >&2; }

log "CRDs of sigs.k8s.io/kueue v$kueue_version"
module_dir=$(go mod download -json "sigs.k8s.io/kueue@v$kueue_version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
bases=$module_dir/config/components/crd/bases
if ! [ -s "$bases/$marker" ]; then
  log "the module sigs.k8s.io/kueue@v$kueue_version has no $bases/$marker"
  exit 1
fi
mkdir -p "$work/out"
install -m 644 "$bases"/*.yaml "$work/out/"  # the module cache is read-only
log "$(ls "$work/out" | wc -l) CRDs"
rm -rf "$dest"
mv "$work/out" "$dest"
echo "$dest"
