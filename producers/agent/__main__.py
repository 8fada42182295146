"""``python -m producers.agent``: the node agent with only its own imports (lean container entry)."""

import sys

from producers.agent.main import main

sys.exit(main())
