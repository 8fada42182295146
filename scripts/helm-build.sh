#!/usr/bin/env bash
# Builds (or finds cached) Helm from the Go module proxy for the chart tests, and takes the
# ServiceMonitor CRD from the prometheus-operator module (the chart's ServiceMonitor is admitted
# only where that CRD is installed). Prints the directory that holds both, as the last line of
# stdout (progress goes to stderr):
#
#   <dir>/helm                                          Helm v4.3.2
#   <dir>/monitoring.coreos.com_servicemonitors.yaml    prometheus-operator's own CRD, unchanged
#
# Helm: `go install helm.sh/helm/v4/cmd/helm@v4.3.2` builds it with exactly the dependency versions
# its go.mod pins (it has no replace or exclude directives, so install accepts it), with the
# release's flags (CGO off, -trimpath, the version stamped with -X as its Makefile does).
# The CRD: the proxy serves the root module github.com/prometheus-operator/prometheus-operator only
# up to v0.85.0 (later versions only as the pkg/apis/monitoring sub-module, which holds the Go types
# and no CRD manifests); example/prometheus-operator-crd/ in the root module holds the generated
# CRDs. ServiceMonitor's schema is monitoring.coreos.com/v1, stable across these versions.
#
# Cost on a cold 2-core machine (empty module and build caches, download included): 236
# CPU-seconds, 253 s wall at nice 10 beside other work, 1.06 GB peak memory; a 67 MB binary.
# Cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/helm/<versions>/, the Go caches under
# ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/ (shared with the other build scripts).
set -euo pipefail

. "$(dirname "$0")/go-build-lib.sh"
helm_version=${GPULENS_HELM_VERSION:-4.3.2}
operator_version=${GPULENS_PROMETHEUS_OPERATOR_VERSION:-0.85.0}
crd=monitoring.coreos.com_servicemonitors.yaml
dest=$gpulens_cache/helm/v$helm_version-prometheus-operator$operator_version
cached() { [ -x "$dest/helm" ] && [ -s "$dest/$crd" ] && echo "$dest"; }
go_build_begin helm-build "the chart tests need it to build Helm v$helm_version and fetch the ServiceMonitor CRD \
of prometheus-operator v$operator_version" cached
mkdir -p "$work/out"

log "ServiceMonitor CRD from github.com/prometheus-operator/prometheus-operator v$operator_version"
operator_dir=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@v$operator_version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
source_crd=$operator_dir/example/prometheus-operator-crd/$crd
if ! [ -s "$source_crd" ]; then
  log "the module github.com/prometheus-operator/prometheus-operator@v$operator_version has no $source_crd"
  exit 1
fi
install -m 644 "$source_crd" "$work/out/$crd"  # the module cache is read-only

log "building helm v$helm_version into $dest (cold: 5-15 min)"
pkg=helm.sh/helm/v4/internal/version
CGO_ENABLED=0 GOBIN=$work/out go install -trimpath \
  -ldflags "-s -w -X $pkg.version=v$helm_version -X $pkg.metadata= -X $pkg.gitTreeState=clean" \
  "helm.sh/helm/v4/cmd/helm@v$helm_version"
log "helm built"

"$work/out/helm" version --short >&2
go_build_install "$work/out" "$dest"
echo "$dest"
