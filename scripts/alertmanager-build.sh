#!/usr/bin/env bash
# Builds (or finds cached) Alertmanager from the Go module proxy for the alert-forwarding tests,
# and prints the path of the binary.
#
# Why a build: the forwarder's tests deliver to a real Alertmanager (its v2 API, grouping and
# webhook receiver with send_resolved), not to a fake. `go install .../cmd/alertmanager@v0.35.0`
# fails: ui/web.go embeds ui/app/dist (the compiled web UI), which the published module does not
# contain. So the module is copied out of the module cache, a one-page placeholder stands in for
# the UI (the tests need only the API), and the copy is built as the main module with its own
# go.mod and go.sum (no replace or exclude directives), i.e. the same dependency versions.
#
# The binary is cached under ${XDG_CACHE_HOME:-~/.cache}/gpulens/alertmanager/v<version>/ and the
# Go caches under ${XDG_CACHE_HOME:-~/.cache}/gpulens/go/ (shared with scripts/kube-build.sh), so
# later runs pay nothing.
set -euo pipefail

. "$(dirname "$0")/go-build-lib.sh"
version=${GPULENS_ALERTMANAGER_VERSION:-0.35.0}
dest=$gpulens_cache/alertmanager/v$version
cached() { [ -x "$dest/alertmanager" ] && echo "$dest/alertmanager"; }
go_build_begin alertmanager-build "the alert forwarding tests need it to build Alertmanager v$version" cached
echo "alertmanager-build: building Alertmanager v$version into $dest" >&2
module=github.com/prometheus/alertmanager
src=$("$GO" mod download -json "$module@v$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
if ! [ -f "$src/go.mod" ]; then
  echo "alertmanager-build: could not download $module@v$version" >&2
  exit 1
fi
cp -R "$src" "$work/src"
chmod -R u+w "$work/src"
for ui in elm mantine; do
  mkdir -p "$work/src/ui/app/dist/$ui"
  echo "<!doctype html><title>Alertmanager</title><p>Web UI not built (gpulens test build); the API is at /api/v2/." \
    >"$work/src/ui/app/dist/$ui/index.html"
done
(
  cd "$work/src"
  pkg=github.com/prometheus/common/version
  "$GO" build -trimpath -o "$work/out/alertmanager" -ldflags "-s -w -X $pkg.Version=$version \
    -X $pkg.Branch=HEAD -X $pkg.BuildUser=gpulens -X $pkg.BuildDate=19700101-00:00:00" ./cmd/alertmanager >&2
)
go_build_install "$work/out" "$dest"
echo "$dest/alertmanager"
