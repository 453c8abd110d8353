"""``python -m cpctl``: the command-line client (see ``cpctl.cli``)."""

import sys

from cpctl.cli import main

sys.exit(main())
