#!/usr/bin/env bash
# `make chaos`: every golden scenario (gpulens/scenarios, and the shared examples in
# tests/data/scenarios or $GPULENS_SHARED_SCENARIOS) through the local
# broker with `replay --kafka --chaos` (the worker SIGKILLed and restarted on a seeded schedule);
# each report must equal the in-process one byte for byte. SEED (default 1) and KILLS (default 8)
# pick the schedule; the broker is the one `gpulens kafka up` manages (GPULENS_LOCAL_KAFKA__PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPULENS_VENV:-$PWD/.venv}
export PATH="$venv/bin:$PATH"
seed=${SEED:-1}
kills=${KILLS:-8}
port=${GPULENS_LOCAL_KAFKA__PORT:-19092}
shared=${GPULENS_SHARED_SCENARIOS:-tests/data/scenarios}
gpulens kafka up
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for scenario in gpulens/scenarios/*.yaml ${shared:+"$shared"/*.yaml}; do
  [ -f "${scenario%.yaml}.expected.json" ] || continue
  name=$(basename "$scenario" .yaml)
  gpulens replay "$scenario" --json > "$work/$name.in-process.json"
  if gpulens replay "$scenario" --kafka "127.0.0.1:$port" --chaos --seed "$seed" --kills "$kills" --json \
      > "$work/$name.chaos.json" 2> "$work/$name.chaos.log" \
      && cmp -s "$work/$name.in-process.json" "$work/$name.chaos.json"; then
    echo "ok      $name ($(grep -c 'SIGKILL worker' "$work/$name.chaos.log") kills)"
  else
    echo "FAILED  $name (seed $seed); chaos log:"; tail -20 "$work/$name.chaos.log"
    failed=1
  fi
done
exit "$failed"
