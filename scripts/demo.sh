#!/usr/bin/env bash
# The README's run command: a fresh machine -> virtual environment, gpulens installed, then the
# live demo on the embedded default (local Kafka + embedded ClickHouse + a simulated fleet).
# Extra arguments go to `gpulens demo` (e.g. --duration 3m).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPULENS_VENV:-$PWD/.venv}
if [ ! -x "$venv/bin/gpulens" ]; then
  echo "== installing gpulens into $venv (first run only)"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[all]"
fi
exec "$venv/bin/gpulens" demo "$@"
