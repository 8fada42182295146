import sys

from benchmarks.harness import main

if sys.argv[1:2] == ["history"]:  # the history benchmark has flags of its own (benchmarks/history/main.py)
    from benchmarks.history.main import main as history_main

    sys.exit(history_main(sys.argv[2:]))
sys.exit(main(sys.argv[1:]))
