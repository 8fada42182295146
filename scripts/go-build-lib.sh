# Sourced by the scripts that build (or fetch) test binaries from the Go module proxy: one place for
# what they share — the cache layout, finding the Go toolchain, one build at a time per tool.
#
#   go_build_begin NAME WHAT CACHED...
#
# NAME is the script's log prefix (its lock and scratch directory are under the cache's build/); WHAT
# says what Go is needed for
# (the error when there is none); CACHED is a command that prints the cached result and succeeds
# when the cache already holds it. go_build_begin exits 0 with that result on a cache hit (before
# looking for Go, and again once it holds the tool's lock: a concurrent run may have built it), exits
# 1 when Go is missing, and otherwise returns with $GO, go(), log() and $work (a scratch directory
# removed on exit) set. GOFLAGS is -buildvcs=false, plus $go_extra_flags where a script sets them.
#
# The caches: ${XDG_CACHE_HOME:-~/.cache}/gpulens/<tool>/ for results (each script names its own),
# .../gpulens/go/{mod,build} for the Go module and build caches shared by every tool.

gpulens_cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpulens

go_build_begin() {
  build_name=$1
  local what=$2
  shift 2
  if "$@"; then
    exit 0
  fi
  # GO names the toolchain; else `go` on PATH, else the official tarball's place (often not on a
  # non-login PATH)
  GO=${GO:-$(type -P go || echo /usr/local/go/bin/go)}
  if ! [ -x "$GO" ]; then
    echo "$build_name: the Go toolchain ('go') is not on PATH (nor at $GO); $what (Go 1.26 or newer)" >&2
    exit 1
  fi
  export GOMODCACHE=$gpulens_cache/go/mod GOCACHE=$gpulens_cache/go/build
  export GOFLAGS="-buildvcs=false${go_extra_flags:+ $go_extra_flags}"
  mkdir -p "$gpulens_cache/build"
  exec 9>"$gpulens_cache/build/$build_name.lock"
  flock 9
  if "$@"; then
    exit 0
  fi
  work=$(mktemp -d "$gpulens_cache/build/$build_name.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}

# go_build_install OUT DEST: put a finished build in the cache, replacing what was there.
go_build_install() {
  mkdir -p "$(dirname "$2")"
  rm -rf "$2"
  mv "$1" "$2"
}

go() { "$GO" "$@"; }

log() { echo "$build_name: [${SECONDS}s] $*" >&2; }
