import sys

from twin.cli_support import exit_early_on_signals

exit_early_on_signals()         # before the heavy imports below

from .cli import main  # noqa: E402

sys.exit(main())
