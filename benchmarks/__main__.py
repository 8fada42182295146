import sys

from benchmarks.harness import main

sys.exit(main(sys.argv[1:]))
