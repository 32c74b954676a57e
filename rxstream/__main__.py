"""``python -m rxstream``: the command line."""

import sys

from rxstream.cli import main

sys.exit(main())
