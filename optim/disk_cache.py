"""The JSON files of the user's cache (``~/.cache/lora-placement`` or ``$LORA_PLACEMENT_CACHE``):
entries added under a lock, files replaced atomically.

Several processes add entries to one file at once (parallel studies, a bound search beside a
solve, the workers of one study): a plain read-modify-write keeps only the last writer's
entries, so measurements that took minutes are silently measured again next time.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sidecar ``<name>.lock`` file (POSIX ``flock``; no lock on
    a platform without it)."""
    try:
        import fcntl
    except ImportError:                       # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_json(path: Path) -> dict:
    """The cache file's entries ({} when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_snapshots: dict[str, tuple[tuple[int, int, int], dict]] = {}


def read_json_cached(path: Path) -> dict:
    """``read_json``, parsed again only when the file changed (inode, size or modification
    time): a study looks entries up thousands of times in a file of a megabyte. The dict
    returned is shared: read it, do not modify it."""
    try:
        st = os.stat(path)
    except OSError:
        return {}
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _snapshots.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    data = read_json(path)
    _snapshots[str(path)] = (stamp, data)
    return data


def dumps_entries(data: dict) -> str:
    """``data`` as a JSON object with one entry per line, keys sorted: a file of thousands of
    entries stays small, and a committed one (a study's search store) changes by the lines of
    the entries that changed."""
    return "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in sorted(data.items())) + "\n}\n"


def update_json(path: Path, new: dict) -> bool:
    """Add ``new``'s entries to the file, keeping every entry other processes wrote; a
    read-only cache directory is left alone (the values are measured again next time):
    False then."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):
            data = read_json(path)
            data.update(new)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(dumps_entries(data))
            os.replace(tmp, path)
    except OSError:
        return False
    return True


__all__ = ["dumps_entries", "locked", "read_json", "read_json_cached", "update_json"]
