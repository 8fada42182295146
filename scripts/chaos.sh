#!/usr/bin/env bash
# `make chaos`: every golden scenario (simulation/scenarios, and the shared examples in
# tests/data/scenarios or $GPULENS_SHARED_SCENARIOS) and tests/stream_jobs/scenarios through the local
# broker with `replay --kafka --workers 3 --chaos` (workers SIGKILLed and restarted on a seeded
# schedule, one added and one removed); each report must equal the in-process one byte for byte.
# SEED (default 1), KILLS (default 8) and WORKERS (default 3) pick the schedule; OUTAGE=S also stops
# the broker for S seconds in each run. RANDOM_SCENARIOS (default 5) more are random scenarios
# (simulation/random_scenario.py) of seeds SEED*1000, SEED*1000+1, ...: files nobody wrote, which
# must replay as in-process too (`python -m simulation.random_scenario N` prints the one of seed N).
# The broker is the one `gpulens kafka up` manages (GPULENS_LOCAL_KAFKA__PORT). BROKERS=3 runs
# every replay on the replicated local cluster (`gpulens kafka up --brokers 3`: every topic with 3
# replicas and min.insync.replicas 2) and, with OUTAGE (then 30 by default), SIGKILLs the broker
# leading one of the replay's input, internal, changelog or output partitions instead of stopping
# the broker, keeps it down OUTAGE seconds and restarts it. A single broker stays the default.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPULENS_VENV:-$PWD/.venv}
export PATH="$venv/bin:$PATH"
seed=${SEED:-1}
kills=${KILLS:-8}
workers=${WORKERS:-3}
brokers=${BROKERS:-1}
case "$brokers" in
  1) outage=${OUTAGE:-0} ;;
  3) outage=${OUTAGE:-30} ;;
  *) echo "BROKERS must be 1 or 3, not $brokers" >&2; exit 2 ;;
esac
export GPULENS_LOCAL_KAFKA__BROKERS=$brokers
random_scenarios=${RANDOM_SCENARIOS:-5}
port=${GPULENS_LOCAL_KAFKA__PORT:-19092}
shared=${GPULENS_SHARED_SCENARIOS:-tests/data/scenarios}
gpulens kafka up --brokers "$brokers"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
# play SCENARIO (file) under chaos and compare with in-process; NAME labels the lines
play() {
  local scenario=$1 name=$2
  gpulens replay "$scenario" --json > "$work/$name.in-process.json"
  if gpulens replay "$scenario" --kafka "127.0.0.1:$port" --workers "$workers" \
      --chaos --seed "$seed" --kills "$kills" --outage "$outage" --json \
      > "$work/$name.chaos.json" 2> "$work/$name.chaos.log" \
      && cmp -s "$work/$name.in-process.json" "$work/$name.chaos.json"; then
    pauses=$(grep -o '[0-9]* read-ahead pauses' "$work/$name.chaos.log" || true)
    leaders=$(grep -c 'SIGKILL broker' "$work/$name.chaos.log" || true)
    echo "ok      $name ($(grep -c 'SIGKILL worker' "$work/$name.chaos.log") kills, $workers workers, ${pauses:-no read-ahead pauses}$([ "$brokers" = 3 ] && echo ", $leaders leader kills on $brokers brokers"))"
  else
    echo "FAILED  $name (seed $seed); chaos log:"; tail -20 "$work/$name.chaos.log"
    failed=1
  fi
}
# the goldens (those with expected results) and the chaos test's 2-hour, 64-GPU fleet
for scenario in simulation/scenarios/*.yaml ${shared:+"$shared"/*.yaml} tests/stream_jobs/scenarios/*.yaml; do
  [ -f "${scenario%.yaml}.expected.json" ] || [[ "$scenario" == tests/stream_jobs/* ]] || continue
  play "$scenario" "$(basename "$scenario" .yaml)"
done
for ((i = 0; i < random_scenarios; i++)); do
  n=$((seed * 1000 + i))
  python -m simulation.random_scenario "$n" > "$work/random-$n.yaml"
  play "$work/random-$n.yaml" "random-$n"
done
exit "$failed"
