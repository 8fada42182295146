"""``python -m gpulens`` = the ``gpulens`` command (the demo starts its children this way)."""

import sys

from gpulens.cli import main

if __name__ == "__main__":  # a spawned child process (the sink's preparing process) imports it again
    sys.exit(main())
