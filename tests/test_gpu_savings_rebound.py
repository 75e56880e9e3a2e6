"""experiments.gpu_savings --rebound recomputes a point's bound as a solve does: the twin lower
bound, raised by the exclusions of ``raise_bound_to`` toward the best count (the rebound path
once skipped that step and reported two certified quick points as one GPU above their
bound)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

import experiments.gpu_savings as GS


def _patch(monkeypatch, best: int, raised: int, calls: list):
    monkeypatch.setattr(GS, "twin_lower_bound",
                        lambda inst, dur, workers, pair, full_counts=False:
                        SimpleNamespace(best=best, one_adapter=1))

    def raise_to(inst, lb, count, dur, workers, supply_checks=None, full_counts=False,
                 class_checks=None):
        calls.append((lb, count, dur))
        return raised
    monkeypatch.setattr(GS, "raise_bound_to", raise_to)


def test_rebound_raises_the_bound_where_the_best_count_is_one_above(monkeypatch):
    calls: list = []
    _patch(monkeypatch, best=1, raised=2, calls=calls)
    part = pd.DataFrame([{"instance": "p", "method": "greedy", "gpus": 2, "failed": False,
                          "duration_s": 600.0},
                         {"instance": "p", "method": "maxbase", "gpus": float("nan"),
                          "failed": True, "duration_s": 600.0}])
    assert GS.rebound(object(), part, 1, 0) == (2, 1)
    assert calls == [(1, 2, 600.0)]


def test_rebound_keeps_the_bound_where_no_step_excludes_a_count(monkeypatch):
    """Two above, the steps without checked searches are tried for the bound's count; when
    they exclude nothing the bound stays."""
    calls: list = []
    _patch(monkeypatch, best=1, raised=1, calls=calls)
    part = pd.DataFrame([{"instance": "p", "method": "greedy", "gpus": 3, "failed": False,
                          "duration_s": 3600.0}])
    assert GS.rebound(object(), part, 1, 0) == (1, 1)
    assert calls == [(1, 2, 3600.0)]


def test_stored_rows_take_the_latest_row_of_the_chosen_study(tmp_path):
    from experiments.common import RowStore
    store = RowStore(tmp_path / "points.jsonl")
    row = {"instance": "p", "method": "greedy", "gpus": 3, "failed": False}
    store.put("a", {**row, "duration_s": 600.0, "gpus": 4})
    store.put("b", {**row, "duration_s": 600.0})
    store.put("c", {**row, "duration_s": 3600.0, "gpus": 5})
    store.put("d", {**row, "method": "maxbase", "duration_s": 600.0})
    quick = GS.stored_rows(store.path, True, "greedy")
    assert quick.to_dict(orient="records") == [{**row, "duration_s": 600.0}]
    assert list(GS.stored_rows(store.path, False, None)["gpus"]) == [5]
    import pytest
    with pytest.raises(ValueError, match="no stored rows"):
        GS.stored_rows(store.path, False, "maxbase")


def test_rebound_stores_a_changed_bound_back_under_the_point_key(tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    from experiments.common import RowStore
    from optim.instance import load_instance

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "inst"
    folder.mkdir()
    for f in (repo / "instances" / "paper").glob("paper-llama-rhigh-qhigh-n16.*"):
        shutil.copy(f, folder / f.name)
    inst = load_instance(folder / "paper-llama-rhigh-qhigh-n16.json")
    monkeypatch.setattr(GS, "point_key", lambda inst, m, d, x, p: f"{inst.name}/{m}/{d}")
    store = RowStore(tmp_path / "points.jsonl")
    row = {"instance": inst.name, "method": "greedy", "gpus": 3, "failed": False,
           "duration_s": 3600.0, "lb": 2, "lb_one": 2, "n": 16, "scenario": "s"}
    store.put(f"{inst.name}/greedy/3600.0", row)
    monkeypatch.setattr(GS, "rebound", lambda inst, part, workers, pair, checks=None: (3, 2))
    args = ["--rebound", str(store.path), "--store", str(store.path), "--instances",
            str(folder), "--methods", "greedy", "--out-dir", str(tmp_path / "out")]
    GS.main(args)
    assert RowStore(store.path).get(f"{inst.name}/greedy/3600.0") == {**row, "lb": 3}
    lines = store.path.read_text().splitlines()
    GS.main(args)                                     # unchanged now: nothing appended
    assert store.path.read_text().splitlines() == lines


def _two_paper_instances(tmp_path):
    """A folder holding copies of two 16-adapter paper instances, and their names."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "inst"
    folder.mkdir()
    names = ("paper-llama-rhigh-qhigh-n16", "paper-llama-rlow-qhigh-n16")
    for name in names:
        for f in (repo / "instances" / "paper").glob(f"{name}.*"):
            shutil.copy(f, folder / f.name)
    return folder, names


def test_rebound_with_match_bounds_only_the_matching_points(tmp_path, monkeypatch, capsys):
    from experiments.common import RowStore

    folder, names = _two_paper_instances(tmp_path)
    monkeypatch.setattr(GS, "point_key", lambda inst, m, d, x, p: f"{inst.name}/{m}/{d}")
    store = RowStore(tmp_path / "points.jsonl")
    row = {"method": "greedy", "gpus": 3, "failed": False, "duration_s": 3600.0, "lb": 2,
           "lb_one": 2, "n": 16, "scenario": "s"}
    for name in names:
        store.put(f"{name}/greedy/3600.0", {**row, "instance": name})
    seen: list = []

    def rebound(inst, part, workers, pair, class_checks=None):
        seen.append((inst.name, class_checks))
        return 3, 2
    monkeypatch.setattr(GS, "rebound", rebound)
    args = ["--rebound", str(store.path), "--store", str(store.path), "--instances",
            str(folder), "--methods", "greedy", "--out-dir", str(tmp_path / "out")]
    assert GS.main(args + ["--match", "rlow", "--class-checks", "50"]) == 0
    assert seen == [("paper-llama-rlow-qhigh-n16", 50)]
    kept = RowStore(store.path)
    assert kept.get("paper-llama-rlow-qhigh-n16/greedy/3600.0")["lb"] == 3
    assert kept.get("paper-llama-rhigh-qhigh-n16/greedy/3600.0")["lb"] == 2
    assert GS.main(args + ["--match", "n999"]) == 2
    assert "--match 'n999'" in capsys.readouterr().err


def test_status_prints_where_each_uncertified_point_stands_without_solving(tmp_path, monkeypatch,
                                                                           capsys):
    """``--status``: the stored points greedy has not certified, with the class step's state
    (from the cache), and a line of counts; nothing is solved or bounded."""
    from experiments.common import RowStore

    folder, names = _two_paper_instances(tmp_path)
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(GS, "solve_point", lambda *a, **k: pytest.fail("solved"))
    monkeypatch.setattr(GS, "rebound", lambda *a, **k: pytest.fail("bounded"))
    store = RowStore(tmp_path / "points.jsonl")
    from optim.instance import load_instance
    for name, gpus in zip(names, (3, 2)):
        inst = load_instance(folder / f"{name}.json")
        store.put(GS.point_key(inst, "greedy", inst.duration_s, 8, GS.PAIR_CHECKS),
                  {"instance": name, "method": "greedy", "gpus": gpus, "lb": 2,
                   "duration_s": inst.duration_s})
    assert GS.main(["--status", "--instances", str(folder), "--store", str(store.path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("paper-llama-rhigh-qhigh-n16: greedy 3, bound 2: ")
    assert out[-1] == ("points=2 certified=1 one_above=1 two_or_more_above=0 failed=0 "
                       "not_stored=0")


def test_search_store_option_points_the_bound_searches_at_a_file(tmp_path, capsys):
    """``--search-store``: the file the bound searches keep their verdicts and progress in
    ($LORA_PLACEMENT_STORE for the workers); a path that cannot hold it is refused naming the
    option, before any work; '' turns it off."""
    import os

    from optim.capacity import STORE_ENV, _store_path
    folder, _ = _two_paper_instances(tmp_path)
    base = ["--status", "--instances", str(folder), "--store", str(tmp_path / "p.jsonl")]
    store = tmp_path / "searches.json"
    assert GS.main(base + ["--search-store", str(store)]) == 0
    assert _store_path() == store.resolve()
    for bad, why in ((tmp_path, "not a file"), (tmp_path / "no" / "s.json", "no folder")):
        assert GS.main(base + ["--search-store", str(bad)]) == 2
        assert f"--search-store {bad}: {why}" in capsys.readouterr().err
    for text in ("[1, 2", "[1, 2]"):
        store.write_text(text)
        assert GS.main(base + ["--search-store", str(store)]) == 2
        assert "not a JSON object of search records" in capsys.readouterr().err
        assert store.read_text() == text                      # left as it is
    assert GS.main(base + ["--search-store", ""]) == 0
    assert _store_path() is None and STORE_ENV not in os.environ


def test_a_point_two_or_more_above_is_raised_a_count_at_a_time_then_checked(monkeypatch):
    """``point_bound``: two or more above, the bound rises one count at a time by the steps
    without checked searches (supply and class checks 0) while they exclude; once one above,
    the checked searches run with the study's budgets; a step that excludes nothing stops."""
    from types import SimpleNamespace

    calls = []

    def fake(inst, lb, target, dur, workers, supply_checks=0, full_counts=False,
             class_checks=None):
        calls.append((lb, target, supply_checks, class_checks))
        return target if target <= top else lb

    monkeypatch.setattr(GS, "raise_bound_to", fake)
    bound = SimpleNamespace(best=4)
    top = 6
    assert GS.point_bound(None, bound, [7, 9], 600.0, 1, class_checks=50) == 6
    assert calls == [(4, 5, 0, 0), (5, 6, 0, 0), (6, 7, GS.SUPPLY_CHECKS, 50)]
    calls.clear()
    top = 5
    assert GS.point_bound(None, bound, [7], 600.0, 1) == 5       # 5 -> 6 not shown: stop
    assert calls == [(4, 5, 0, 0), (5, 6, 0, 0)]
    calls.clear()
    assert GS.point_bound(None, bound, [4], 600.0, 1) == 4       # certified: nothing to do
    assert GS.point_bound(None, bound, [], 600.0, 1) == 4 and calls == []
