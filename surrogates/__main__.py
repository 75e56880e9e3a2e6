"""``python -m surrogates {build,train,evaluate}`` (see ``surrogates.cli``)."""

from twin.cli_support import exit_early_on_signals

exit_early_on_signals()         # before the heavy imports below

from .cli import main  # noqa: E402

raise SystemExit(main())
