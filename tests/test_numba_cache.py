"""numba's cache keys a function on its own file only; ``twin.numba_cache.refresh_stale`` makes a
package rebuild its caches when any of its numba sources changed (a caller in one file, a
callee edited in another)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from twin.numba_cache import MARKER, numba_sources, refresh_stale

REPO = Path(__file__).resolve().parents[1]


def _package(root: Path, guard: bool, value: int) -> Path:
    pkg = root / "pkg"
    pkg.mkdir(exist_ok=True)
    init = ("from twin.numba_cache import refresh_stale\nrefresh_stale(__path__[0])\n"
            if guard else "")
    (pkg / "__init__.py").write_text(init)
    (pkg / "callee.py").write_text(textwrap.dedent(f"""
        from numba import njit

        @njit(cache=True)
        def g():
            return {value}
    """))
    (pkg / "caller.py").write_text(textwrap.dedent("""
        from numba import njit
        from .callee import g

        @njit(cache=True)
        def f():
            return g() + 0
    """))
    return pkg


def _run(root: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(REPO)])
    out = subprocess.run([sys.executable, "-c", "from pkg.caller import f; print(f())"],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout.strip())


def test_an_edited_callee_reaches_a_cached_caller(tmp_path):
    """Without the guard the caller's cache keeps the callee's old body (the failure this
    module exists for); with it the edit is seen."""
    bare, guarded = tmp_path / "bare", tmp_path / "guarded"
    for root, guard in ((bare, False), (guarded, True)):
        root.mkdir()
        _package(root, guard, 1)
        assert _run(root) == 1
        _package(root, guard, 2)                  # only the callee's file changes
    assert _run(bare) == 1                        # stale: numba's own behaviour
    assert _run(guarded) == 2


def test_refresh_clears_only_when_the_sources_change(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "a.py").write_text("from numba import njit\n@njit(cache=True)\ndef f():\n  return 1\n")
    (pkg / "b.py").write_text("x = 1\n")                       # no numba cache: ignored
    assert numba_sources(pkg) == [pkg / "a.py"]
    stale = pkg / "__pycache__" / "a.f-2.py311.nbi"
    other = pkg / "__pycache__" / "b.cpython-311.pyc"
    stale.write_bytes(b"x")
    other.write_bytes(b"x")
    assert refresh_stale(pkg) and not stale.exists() and other.exists()
    assert (pkg / "__pycache__" / MARKER).is_file()
    stale.write_bytes(b"x")
    assert not refresh_stale(pkg) and stale.exists()           # unchanged: kept
    (pkg / "a.py").write_text((pkg / "a.py").read_text().replace("1", "2"))
    assert refresh_stale(pkg) and not stale.exists()
