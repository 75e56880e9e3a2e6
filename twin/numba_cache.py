"""Keep numba's on-disk caches from serving code compiled against an older version of a package.

numba's ``cache=True`` keys a compiled function on the file that defines it (numba 0.68: a hash
of that file's content), not on the files whose jitted functions it calls. ``twin.kernel``
calls ``twin.step_time.step_time_ms``: after an edit of ``step_time.py`` alone (or a ``git
pull`` that changes only it), the kernel's cached machine code keeps the old step-time formula
while every pure-Python path (the reference kernel, calibration's design matrices) uses the new
one — silently. :func:`refresh_stale` closes that hole: each package that compiles with
``cache=True`` calls it on import with its own folder; it hashes the package's numba sources
and, when the hash differs from the one recorded beside the caches, deletes the cache files of
those sources (in-tree ``__pycache__``, ``NUMBA_CACHE_DIR`` and numba's user-wide cache), so
each function is compiled once more, and records the new hash. Unchanged sources cost one read
of the package's files; numba itself is imported only when something must be deleted.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MARKER = "numba-sources.sha256"


def numba_sources(package_dir: Path) -> list[Path]:
    """The package's Python files that compile with numba's on-disk cache."""
    out = []
    for p in sorted(Path(package_dir).rglob("*.py")):
        try:
            if "cache=True" in p.read_text(encoding="utf-8"):
                out.append(p)
        except OSError:
            continue
    return out


def sources_digest(files: list[Path]) -> str:
    """One hash of the files' names and contents."""
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_dirs(py_file: Path) -> set[Path]:
    """Where numba may keep the cache of functions defined in ``py_file``."""
    dirs = {py_file.parent / "__pycache__"}
    try:
        from numba.core import caching, config
        from numba.misc.appdirs import AppDirs
        sub = caching._CacheLocator.get_suitable_cache_subpath(str(py_file))
        if config.CACHE_DIR:
            dirs.add(Path(config.CACHE_DIR) / sub)
        dirs.add(Path(AppDirs(appname="numba", appauthor=False).user_cache_dir) / sub)
    except Exception:       # another numba layout: the in-tree folder is still cleared
        pass
    return dirs


def clear_caches(files: list[Path]) -> int:
    """Delete numba's cache files (index ``.nbi`` and data ``.nbc``) of ``files``; returns
    how many were deleted."""
    n = 0
    for p in files:
        for d in cache_dirs(p):
            if not d.is_dir():
                continue
            for f in d.glob(f"{p.stem}.*.nb[ic]"):
                try:
                    f.unlink()
                    n += 1
                except FileNotFoundError:
                    pass
    return n


def refresh_stale(package_dir: str | os.PathLike) -> bool:
    """Clear the numba caches of ``package_dir``'s sources when their content changed since the
    last call (module docstring); True when it did."""
    d = Path(package_dir)
    try:
        files = numba_sources(d)
        if not files:
            return False
        digest = sources_digest(files)
        marker = d / "__pycache__" / MARKER
        if marker.is_file() and marker.read_text().strip() == digest:
            return False
        clear_caches(files)
        marker.parent.mkdir(exist_ok=True)
        tmp = marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(digest + "\n")
        os.replace(tmp, marker)
        return True
    except OSError:        # a read-only install: its sources are not edited in place
        return False


__all__ = ["MARKER", "numba_sources", "sources_digest", "cache_dirs", "clear_caches",
           "refresh_stale"]
