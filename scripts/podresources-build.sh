#!/usr/bin/env bash
# Builds (or finds cached) podresources-server: a grpc-go PodResources v1 server made from the
# generated code of k8s.io/kubelet's own pkg/apis/podresources/v1 package (scripts/podresources-server/,
# its go.mod and go.sum pin k8s.io/kubelet v0.37.2), which the agent's PodResources tests run
# against beside the grpcio fake. Prints the binary's path as the last line of stdout (progress
# goes to stderr).
#
# Cost on a cold 2-core machine (empty module and build caches, download included): 16 MB of
# modules (grpc-go, protobuf, k8s.io/kubelet and their few dependencies), 38 CPU-seconds, 26 s wall
# at nice 10 beside other work; 6 s when the Go build cache already holds grpc-go and protobuf; a
# 10 MB binary.
# Cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/podresources/<hash of the sources>/ (an edit to
# the server rebuilds it), the Go caches under ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/ (shared with
# the other build scripts).
set -euo pipefail

. "$(dirname "$0")/go-build-lib.sh"
src=$(cd "$(dirname "$0")/podresources-server" && pwd)
digest=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
dest=$gpulens_cache/podresources/$digest
cached() { [ -x "$dest/podresources-server" ] && echo "$dest/podresources-server"; }
go_extra_flags=-mod=readonly
go_build_begin podresources-build "the agent's PodResources tests need it to build a \
grpc-go server from k8s.io/kubelet" cached
log "building podresources-server (k8s.io/kubelet podresources/v1 + grpc-go) into $dest"
# the sources are copied: the build writes nothing into the working tree
cp "$src/go.mod" "$src/go.sum" "$src/main.go" "$work/"
mkdir -p "$work/out"
(cd "$work" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$work/out/podresources-server" .)
log "podresources-server built"
go_build_install "$work/out" "$dest"
echo "$dest/podresources-server"
