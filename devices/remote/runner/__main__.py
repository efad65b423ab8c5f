"""``python -m edgemask.devices.remote.runner ...`` on the host; the zipapp's own ``__main__.py`` does the same on a board."""

import sys

from .cli import main

sys.exit(main())
