import sys

from benchmarks.harness import main

if __name__ == "__main__":  # the sink's preparing process (spawned) imports this module again
    sys.exit(main(sys.argv[1:]))
