"""``python -m scripts.bench``: see :mod:`scripts.bench.run`."""

import sys

from scripts.bench.run import main

sys.exit(main())
