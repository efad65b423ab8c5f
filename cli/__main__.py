"""``python -m edgemask.cli …``: the ``edgemask`` command line without the console script."""

import sys

from edgemask.cli.main import main

sys.exit(main())
