"""``python -m surrogates {build,train,evaluate}`` (see ``surrogates.cli``)."""

from .cli import main

raise SystemExit(main())
