"""``python -m pmpipe.cli``: the ``pmpipe`` command."""

import sys

from pmpipe.cli import main

sys.exit(main())
