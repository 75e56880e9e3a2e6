"""Entry point: ``python -m optim``."""

import sys

from .cli import main

sys.exit(main())
