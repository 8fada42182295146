#!/usr/bin/env bash
# Builds (or finds cached) etcd and kube-apiserver from the Go module proxy for the real-server
# watcher tests, and prints the directory that holds them.
#
# Why a build: k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces its staging modules
# with local paths), so a throw-away build module requires it and replaces each staging module
# with the published v0.<minor>.<patch> of the same release; sample-cli-plugin and
# sample-controller are not served and kube-apiserver does not import them, so empty local modules
# stand in. etcd's server module is its main package.
#
# Cost on a cold machine: ~150 MB of modules, ~1,100 CPU-seconds, 2.4 GB peak memory (the linker).
# Binaries are cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/kube/<versions>/ and the Go caches
# under ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/, so later runs pay nothing.
set -euo pipefail

kube_version=${GPULENS_KUBE_VERSION:-1.37.2}
etcd_version=${GPULENS_ETCD_VERSION:-3.7.0}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpulens
dest=$cache/kube/v$kube_version-etcd$etcd_version

if [ -x "$dest/kube-apiserver" ] && [ -x "$dest/etcd" ]; then
  echo "$dest"
  exit 0
fi

# GO names the toolchain; else `go` on PATH, else the official tarball's place (often not on a
# non-login PATH)
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
if ! [ -x "$GO" ]; then
  echo "kube-build: the Go toolchain ('go') is not on PATH (nor at $GO); the real-server watcher tests" \
    "need it to build etcd v$etcd_version and kube-apiserver v$kube_version (Go 1.26 or newer)" >&2
  exit 1
fi
go() { "$GO" "$@"; }

export GOMODCACHE=$cache/go/mod GOCACHE=$cache/go/build GOFLAGS=-buildvcs=false
mkdir -p "$cache/kube"
exec 9>"$cache/kube/build.lock"
flock 9
if [ -x "$dest/kube-apiserver" ] && [ -x "$dest/etcd" ]; then
  echo "$dest"
  exit 0
fi

work=$(mktemp -d "$cache/kube/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
staging_version=v0.${kube_version#*.}
log() { echo "kube-build: $*" >&2; }

log "building etcd v$etcd_version and kube-apiserver v$kube_version into $dest (cold: 10-30 min)"

mkdir -p "$work/etcd"
(
  cd "$work/etcd"
  go mod init gpulens.local/etcd-build >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v$etcd_version" >&2
  go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3
)
log "etcd built"

kube_gomod=$(go mod download -json "k8s.io/kubernetes@v$kube_version" |
  sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$kube_gomod")
if [ "${#staging[@]}" -eq 0 ]; then
  log "found no staging replace directives in $kube_gomod"
  exit 1
fi

mkdir -p "$work/kube"
(
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
  go get "k8s.io/kubernetes/cmd/kube-apiserver@v$kube_version" >&2
  minor=${kube_version#*.}
  minor=${minor%%.*}
  pkg=k8s.io/component-base/version
  go build -trimpath -o "$work/out/kube-apiserver" -ldflags "-s -w \
    -X $pkg.gitVersion=v$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor \
    -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
    k8s.io/kubernetes/cmd/kube-apiserver
)
log "kube-apiserver built"

rm -rf "$dest"
mv "$work/out" "$dest"
echo "$dest"
