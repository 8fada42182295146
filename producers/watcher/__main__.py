"""``python -m producers.watcher``: the cluster watcher without the rest of the CLI."""

import sys

from producers.watcher.main import main

if __name__ == "__main__":  # a spawned child process (the sink's preparing process) imports it again
    sys.exit(main())
