"""``python3 -m tracebench``: see tracebench/cli.py."""

import sys

from .cli import main

sys.exit(main())
