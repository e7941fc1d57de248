"""``python -m hydrax``: the same as the ``hydrax`` command."""

import sys

from .cli import main

sys.exit(main())
