"""The ``lora-placement`` console script: one entry for every command of the toolkit.

``lora-placement plan|solve|deploy|replan|generate|methods ...`` runs ``python -m optim ...``;
``lora-placement run|maxpack|serve|calibrate|calibrate-power|derive ...`` runs
``python -m twin ...``; ``lora-placement surrogates ...`` runs ``python -m surrogates ...``;
``lora-placement harness ...`` runs ``python -m twin.harness ...``.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

OPTIM = ("plan", "solve", "deploy", "replan", "generate", "methods")
TWIN = ("run", "maxpack", "serve", "calibrate", "calibrate-power", "derive")
USAGE = ("usage: lora-placement COMMAND [ARGS ...]\n\n"
         "placement:  plan (adapters CSV -> plan folder), solve, deploy, replan, generate, "
         "methods\n"
         "twin:       run, maxpack, serve, calibrate, calibrate-power, derive\n"
         "other:      surrogates (build|train|evaluate|pipeline), harness (verify|profile)\n\n"
         "'lora-placement COMMAND --help' describes a command; each is also "
         "'python -m optim|twin|surrogates|twin.harness COMMAND'.")


def _entry(cmd: str) -> tuple[Callable[[Sequence[str] | None], int], bool] | None:
    """(main function, whether the command name is passed on) for ``cmd``."""
    if cmd in OPTIM:
        from .cli import main
        return main, True
    if cmd in TWIN:
        from twin.cli import main
        return main, True
    if cmd == "surrogates":
        from surrogates.cli import main
        return main, False
    if cmd == "harness":
        from twin.harness.cli import main
        return main, False
    return None


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:                    # the console script itself, not a caller in-process
        from twin.cli_support import exit_early_on_signals
        exit_early_on_signals()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    found = _entry(args[0])
    if found is None:
        print(f"error: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    fn, keep = found
    return fn(args if keep else args[1:])


if __name__ == "__main__":
    sys.exit(main())
