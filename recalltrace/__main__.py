"""``python -m recalltrace``: the command line."""

import sys

from recalltrace.cli import main

sys.exit(main())
