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

echo "== etcd and kube-apiserver for the real-server watcher tests (built once, then cached)"
# A missing Go toolchain or a failed build fails the run here, with the reason, before any test.
bash scripts/kube-build.sh
echo "== prometheus and promtool for the Prometheus scrape tests (built once, then cached)"
bash scripts/prometheus-build.sh
echo "== Alertmanager for the alert-forwarding tests (built once, then cached)"
bash scripts/alertmanager-build.sh

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
