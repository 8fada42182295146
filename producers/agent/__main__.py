"""``python -m producers.agent``: the node agent with only its own imports (lean container entry)."""

import sys

from producers.agent.main import main

if __name__ == "__main__":  # a spawned child process (the sink's preparing process) imports it again
    sys.exit(main())
