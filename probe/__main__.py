"""``python -m probe``: the ``probe`` command line."""

import sys

from probe.app.cli import main

sys.exit(main())
