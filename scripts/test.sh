#!/usr/bin/env bash
# The README's test command: a fresh machine -> virtual environment, project installed, the real
# local Kafka broker started through `gpulens kafka up`, lint + architecture checks, the whole test
# suite, the broker stopped, the tests' status returned ("no tests collected" fails).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${GPULENS_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
echo "== installing gpulens and its test dependencies"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"

if ! command -v chromium >/dev/null 2>&1; then
  # tests/report renders the HTML report in headless Chromium (Debian's package)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (headless browser for the HTML report test)"
    apt-get update -qq && apt-get install -y -qq chromium
  else
    echo "== chromium missing and not installable here (needs root and apt-get): the HTML report browser test will fail" >&2
  fi
fi

export PATH="$venv/bin:$PATH"
export GPULENS_DATA_DIR=${GPULENS_TEST_DATA_DIR:-$root/.gpulens-test}
export GPULENS_LOCAL_KAFKA__PORT=${GPULENS_TEST_KAFKA_PORT:-19092}
export GPULENS_LOCAL_KAFKA__CONTROLLER_PORT=${GPULENS_TEST_KAFKA_CONTROLLER_PORT:-19093}
export GPULENS_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:$GPULENS_LOCAL_KAFKA__PORT"
export GPULENS_LOG_FORMAT=text

echo "== static checks (ruff, import-linter, mypy)"
ruff check .
lint-imports
mypy .

echo "== the real servers and tools the tests run, built once from the Go module proxy, then cached;"
echo "   the builds at the same time (logs in \$GPULENS_DATA_DIR/build-logs/):"
echo "   kube: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (real-server tests)"
echo "   prometheus: prometheus and promtool (Prometheus scrape tests)"
echo "   alertmanager: Alertmanager (alert-forwarding tests)"
echo "   helm: Helm and the ServiceMonitor CRD (chart tests)"
echo "   podresources: a grpc-go PodResources server from k8s.io/kubelet (agent PodResources tests)"
echo "   kueue: Kueue's own CRDs from the sigs.k8s.io/kueue module (Kueue tests; fetched, not built)"
# A missing Go toolchain or a failed build fails the run here, with the reason, before any test.
build_logs=$GPULENS_DATA_DIR/build-logs
mkdir -p "$build_logs"
declare -A building=()
builds_started=$SECONDS
declare -A build_script=([kube]=kube-build.sh [prometheus]=prometheus-build.sh
  [alertmanager]=alertmanager-build.sh [helm]=helm-build.sh [kueue]=kueue-crds.sh
  [podresources]=podresources-build.sh)
for name in kube prometheus alertmanager helm kueue podresources; do
  bash "scripts/${build_script[$name]}" >"$build_logs/$name.out" 2>"$build_logs/$name.log" &
  building[$name]=$!
done
build_failed=()
next_beat=$((SECONDS + 60))
while [ "${#building[@]}" -gt 0 ]; do
  for name in "${!building[@]}"; do
    kill -0 "${building[$name]}" 2>/dev/null && continue
    status=0
    wait "${building[$name]}" || status=$?
    unset "building[$name]"
    if [ "$status" -eq 0 ]; then
      echo "== $name ready after $((SECONDS - builds_started))s: $(tail -n 1 "$build_logs/$name.out")"
    else
      echo "== $name build FAILED (exit $status); the end of $build_logs/$name.log:" >&2
      tail -n 40 "$build_logs/$name.log" | sed "s/^/   $name: /" >&2
      build_failed+=("$name")
    fi
  done
  [ "${#building[@]}" -eq 0 ] && break
  sleep 1
  if [ "$SECONDS" -ge "$next_beat" ]; then
    echo "== [$((SECONDS - builds_started))s] still building: ${!building[*]}"
    next_beat=$((SECONDS + 60))
  fi
done
if [ "${#build_failed[@]}" -gt 0 ]; then
  echo "== failed builds: ${build_failed[*]}" >&2
  exit 1
fi

echo "== starting the local Kafka broker"
gpulens kafka up
trap 'echo "== stopping the local Kafka broker"; gpulens kafka down || true' EXIT

echo "== running the test suite"
set +e
python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
