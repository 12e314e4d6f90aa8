"""``python -m speculative``: the command line (:mod:`speculative.cli`)."""

import sys

from speculative.cli import main

sys.exit(main())
