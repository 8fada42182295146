"""``python -m gpulens`` = the ``gpulens`` command (the demo starts its children this way)."""

import sys

from gpulens.cli import main

sys.exit(main())
