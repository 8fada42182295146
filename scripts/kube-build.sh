#!/usr/bin/env bash
# Builds (or finds cached) etcd and the Kubernetes control plane the tests run against
# (kube-apiserver, kube-controller-manager, kube-scheduler) plus kubectl, all from the Go module
# proxy, and prints the directory that holds them (last line of stdout; progress goes to stderr).
#
# Why a build: k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces its staging modules
# with local paths), so a throw-away build module requires it and replaces each staging module
# with the published v0.<minor>.<patch> of the same release; sample-cli-plugin and
# sample-controller are not served and none of the four commands imports them, so empty local
# modules stand in. The four commands come out of ONE `go build` of that module: one dependency
# graph, so kubectl talks to the very apiserver it was built with, and each shared package is
# compiled once. etcd's server module is its main package; it builds at the same time (the two
# graphs share little, and downloads and links overlap the other's compiles).
#
# Cost on a cold machine: ~150 MB of modules; ~1,100 CPU-seconds for etcd and kube-apiserver, and
# 240 more for kube-controller-manager, kube-scheduler and kubectl (measured with etcd's and
# kube-apiserver's packages already in the build cache: they share most of theirs), so ~1,350
# CPU-seconds, 11-12 min on an idle 2-core machine; 2.8 GB peak memory (the linkers). Binaries:
# 119 MB kube-apiserver, 105 MB kube-controller-manager, 81 MB kube-scheduler, 79 MB kubectl,
# 25 MB etcd.
# Binaries are cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/kube/<versions>-<set>/ and the Go
# caches under ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/, so later runs pay nothing.
set -euo pipefail

. "$(dirname "$0")/go-build-lib.sh"

kube_version=${GPULENS_KUBE_VERSION:-1.37.2}
etcd_version=${GPULENS_ETCD_VERSION:-3.7.0}
kube_commands=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
binaries=(etcd "${kube_commands[@]}")
# "cp4" names the set of binaries: a cache directory from a build with fewer is never reused
dest=$gpulens_cache/kube/v$kube_version-etcd$etcd_version-cp4

all_built() {
  local binary
  for binary in "${binaries[@]}"; do
    [ -x "$1/$binary" ] || return 1
  done
}

cached() { all_built "$dest" && echo "$dest"; }
go_build_begin kube-build "the real-server tests need it to build etcd v$etcd_version and kube-apiserver \
v$kube_version, kube-controller-manager, kube-scheduler and kubectl" cached
# an interrupted run stops its builds before removing their directory
trap 'kill $(jobs -p) 2>/dev/null || true; wait || true; rm -rf "$work"' EXIT
staging_version=v0.${kube_version#*.}

build_etcd() {
  mkdir -p "$work/etcd"
  cd "$work/etcd"
  go mod init gpulens.local/etcd-build
  go get "go.etcd.io/etcd/server/v3@v$etcd_version"
  go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3
}

build_kube() {
  local kube_gomod module minor packages=() staging=()
  kube_gomod=$(go mod download -json "k8s.io/kubernetes@v$kube_version" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$kube_gomod")
  if [ "${#staging[@]}" -eq 0 ]; then
    echo "found no staging replace directives in $kube_gomod"
    return 1
  fi
  mkdir -p "$work/kube"
  cd "$work/kube"
  {
    echo "module gpulens.local/kube-build"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes v$kube_version"
    echo
    echo "replace ("
    for module in "${staging[@]}"; do
      case $module in
        k8s.io/sample-cli-plugin | k8s.io/sample-controller)
          mkdir -p "empty/${module#k8s.io/}"
          echo "module $module" >"empty/${module#k8s.io/}/go.mod"
          echo "	$module => ./empty/${module#k8s.io/}"
          ;;
        *) echo "	$module => $module $staging_version" ;;
      esac
    done
    echo ")"
  } >go.mod
  for module in "${kube_commands[@]}"; do
    packages+=("k8s.io/kubernetes/cmd/$module")
  done
  go get "${packages[@]/%/@v$kube_version}"
  minor=${kube_version#*.}
  minor=${minor%%.*}
  local pkg=k8s.io/component-base/version
  mkdir -p "$work/out"
  # several main packages and -o naming a directory: each binary lands there under its own name
  go build -trimpath -o "$work/out/" -ldflags "-s -w \
    -X $pkg.gitVersion=v$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
    -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
    "${packages[@]}"
}

log "building etcd v$etcd_version and ${kube_commands[*]} v$kube_version into $dest" \
  "(at the same time; cold: 15-40 min on 2 cores)"
mkdir -p "$work/out"
# each build in the background with its own log, so a failure shows its own tail; `set -e` holds
# inside each (a background subshell is not a condition context)
(set -e; build_etcd) >"$work/etcd.log" 2>&1 &
etcd_pid=$!
(set -e; build_kube) >"$work/kube.log" 2>&1 &
kube_pid=$!

declare -A pending=([etcd]=$etcd_pid [kube]=$kube_pid)
failed=()
next_beat=$((SECONDS + 60))
while [ "${#pending[@]}" -gt 0 ]; do
  for name in "${!pending[@]}"; do
    pid=${pending[$name]}
    kill -0 "$pid" 2>/dev/null && continue
    status=0
    wait "$pid" || status=$?
    unset "pending[$name]"
    if [ "$status" -eq 0 ]; then
      log "$name built"
    else
      log "$name build FAILED (exit $status); the last lines of its log:"
      tail -n 40 "$work/$name.log" | sed "s/^/kube-build: $name: /" >&2
      failed+=("$name")
    fi
  done
  [ "${#pending[@]}" -eq 0 ] && break
  sleep 1
  # a heartbeat a minute, so a 20-minute cold build never looks hung
  if [ "$SECONDS" -ge "$next_beat" ]; then
    log "still building: ${!pending[*]}"
    next_beat=$((SECONDS + 60))
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi

for binary in "${binaries[@]}"; do
  if ! [ -x "$work/out/$binary" ]; then
    log "the build finished without $binary"
    exit 1
  fi
done
"$work/out/kube-apiserver" --version >&2
go_build_install "$work/out" "$dest"
echo "$dest"
