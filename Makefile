.PHONY: install test bench bench-history chaos kafka-up kafka-down topics demo lint fuzz

VENV ?= .venv
PY := $(VENV)/bin/python

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"

install: $(PY)

test:
	bash scripts/test.sh

lint: $(PY)
	$(VENV)/bin/ruff check . && $(VENV)/bin/lint-imports && $(VENV)/bin/mypy .

kafka-up: $(PY)
	$(VENV)/bin/gpulens kafka up

kafka-down: $(PY)
	$(VENV)/bin/gpulens kafka down

topics: $(PY)
	$(VENV)/bin/gpulens topics create

# SEED, KILLS, WORKERS, OUTAGE, RANDOM_SCENARIOS (scripts/chaos.sh); BROKERS=3 on the replicated local
# cluster, where the outage SIGKILLs a partition leader's broker
chaos: $(PY)
	BROKERS=$(or $(BROKERS),1) bash scripts/chaos.sh

# every benchmark, the history one at a size that fits minutes (benchmarks/bench_history.py);
# `make bench-history GPUS=1024 DAYS=30` is the full size (a filled store is cached between runs)
bench: $(PY)
	$(PY) -m benchmarks $(ARGS)

bench-history: $(PY)
	$(PY) -m benchmarks history --gpus $(or $(GPUS),1024) --days $(or $(DAYS),30) $(ARGS)

demo: $(PY)
	$(VENV)/bin/gpulens demo

# the hostile-input property test, long: GPULENS_FUZZ_EXAMPLES (default 20000) in process, 20 seeded
# sets through the local broker (`make kafka-up` first)
fuzz: $(PY)
	GPULENS_FUZZ=1 $(PY) -m pytest -p no:randomly -q tests/poison $(ARGS)
