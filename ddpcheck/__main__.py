"""``python -m ddpcheck`` is the CLI."""

import sys

from ddpcheck.cli import main

sys.exit(main())
