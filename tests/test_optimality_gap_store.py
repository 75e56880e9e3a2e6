"""experiments.optimality_gap keeps each instance's row as it finishes and reuses it: a stopped
run continues where it stopped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import experiments.optimality_gap as G
from experiments.common import RowStore

REPO = Path(__file__).resolve().parent.parent
TINY = "small-12-llama-n8-g1-zipf.json"


def test_rows_are_stored_and_reused(tmp_path, monkeypatch):
    src = tmp_path / "small"
    src.mkdir()
    shutil.copy(REPO / "instances" / "small" / TINY, src / TINY)
    monkeypatch.setattr(G, "SMALL_DIR", src)
    monkeypatch.setattr(G, "MEDIUM", ())
    store_path = tmp_path / "points.jsonl"
    assert G.run(False, 10.0, 120.0, tmp_path / "out", None, 1, ("small",),
                 RowStore(store_path)) == 0
    first = (tmp_path / "out" / "optimality_gap.csv").read_text()
    assert len(store_path.read_text().splitlines()) == 1

    import optim.methods as M

    def no_solve(*a, **k):
        raise AssertionError("a stored instance was solved again")
    monkeypatch.setattr(M, "solve", no_solve)
    assert G.run(False, 10.0, 120.0, tmp_path / "out", None, 1, ("small",),
                 RowStore(store_path)) == 0
    assert (tmp_path / "out" / "optimality_gap.csv").read_text() == first
    # another window is another point: measured again (here: refused by the patched solve)
    with pytest.raises(AssertionError, match="solved again"):
        G.run(False, 10.0, 300.0, tmp_path / "out", None, 1, ("small",), RowStore(store_path))
