"""``python -m producers.watcher``: the cluster watcher without the rest of the CLI."""

import sys

from producers.watcher.main import main

sys.exit(main())
