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

. "$(dirname "$0")/go-build-lib.sh"
kueue_version=${GPULENS_KUEUE_VERSION:-0.17.0}
dest=$gpulens_cache/kueue-v$kueue_version
marker=kueue.x-k8s.io_workloads.yaml
cached() { [ -s "$dest/$marker" ] && echo "$dest"; }
go_build_begin kueue-crds "the Kueue tests need it to fetch the CRDs of sigs.k8s.io/kueue v$kueue_version from the \
Go module proxy" cached

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
go_build_install "$work/out" "$dest"
echo "$dest"
