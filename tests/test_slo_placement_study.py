"""``experiments.slo_placement --rebound``: stored points get the current code's bound."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import experiments.gpu_savings as G
import experiments.slo_placement as S
from experiments.common import RowStore
from optim.instance import instance_from_dict
from twin.slo import Slo


def test_rebound_recomputes_the_bound_and_stores_only_changed_rows(tmp_path, monkeypatch):
    inst = instance_from_dict({
        "name": "rebound", "adapters": [{"id": "a", "rank": 8, "rate": 0.5}],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 2}],
        "slo": Slo(itl_p99_ms=100.0).to_dict()})
    rows = [{"method": "greedy", "gpus": 3, "lb": 2, "lb_one": 1, "duration_s": 600.0},
            {"method": "loraserve", "gpus": 4, "lb": 2, "lb_one": 1, "duration_s": 600.0}]
    seen = {}
    monkeypatch.setattr(G, "twin_lower_bound",
                        lambda *a, **k: SimpleNamespace(best=2, one_adapter=1))

    def point_bound(inst_, bound, counts, duration_s, workers, class_checks=None):
        seen["counts"], seen["class_checks"] = counts, class_checks
        return 3
    monkeypatch.setattr(G, "point_bound", point_bound)
    store = RowStore(tmp_path / "rows.jsonl")
    out = S.rebound_point(inst, ["greedy", "loraserve"], rows, 600.0, 1, store, 700)
    assert seen["counts"] == [3, 4] and seen["class_checks"] == 700     # --class-checks
    assert [r["lb"] for r in out] == [3, 3] and [r["gpus"] for r in out] == [3, 4]
    key = S.point_key(inst, "greedy", 600.0, S.MAX_EXTRA, 0)
    assert RowStore(tmp_path / "rows.jsonl").get(key)["lb"] == 3
    monkeypatch.setattr(G, "point_bound", lambda *a, **k: 3)
    before = (tmp_path / "rows.jsonl").read_text()
    S.rebound_point(inst, ["greedy", "loraserve"], out, 600.0, 1, store)
    assert (tmp_path / "rows.jsonl").read_text() == before        # nothing changed: no write


def test_keep_bound_reruns_a_missing_method_with_the_points_stored_bound(tmp_path, monkeypatch):
    """A point whose greedy row was removed: with ``keep_bound`` greedy runs again and takes the
    lower bound stored with the point's other row (no bound search); without it the bound is
    computed anew."""
    inst = instance_from_dict({
        "name": "keep", "adapters": [{"id": "a", "rank": 8, "rate": 0.5}],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 2}],
        "slo": Slo(itl_p99_ms=100.0).to_dict()})
    store = RowStore(tmp_path / "rows.jsonl")
    store.put(S.point_key(inst, "loraserve", 600.0, S.MAX_EXTRA, 0),
              {"instance": "keep", "method": "loraserve", "gpus": 4, "lb": 3, "lb_one": 1,
               "duration_s": 600.0})
    ran = []
    monkeypatch.setattr(G, "gpus_needed", lambda inst_, m, *a: ran.append(m) or {"gpus": 3})

    def no_bound(*a, **k):
        raise AssertionError("the bound was computed")
    monkeypatch.setattr(G, "twin_lower_bound", no_bound)
    rows = G.solve_point(inst, ["greedy", "loraserve"], 600.0, S.MAX_EXTRA, 0, 1, store,
                         {"instance": "keep"}, "abc", keep_bound=True)
    assert ran == ["greedy"]
    assert [(r["method"], r["gpus"], r["lb"], r["lb_one"]) for r in rows] == \
        [("greedy", 3, 3, 1), ("loraserve", 4, 3, 1)]
    key = S.point_key(inst, "greedy", 600.0, S.MAX_EXTRA, 0)
    assert RowStore(tmp_path / "rows.jsonl").get(key)["lb"] == 3
    # without keep_bound a missing row computes the bound
    fresh = RowStore(tmp_path / "fresh.jsonl")
    fresh.put(S.point_key(inst, "loraserve", 600.0, S.MAX_EXTRA, 0),
              {"method": "loraserve", "gpus": 4, "lb": 3, "lb_one": 1})
    with pytest.raises(AssertionError, match="the bound was computed"):
        G.solve_point(inst, ["greedy", "loraserve"], 600.0, S.MAX_EXTRA, 0, 1, fresh,
                      {"instance": "keep"}, "abc")


@pytest.mark.parametrize("main", [S.main, G.main])
@pytest.mark.parametrize("value, reason", [("-1", "must be >= 0"),
                                           ("many", "a whole number of GPU checks")])
def test_the_studies_refuse_a_bad_class_check_budget(main, value, reason, capsys):
    """``--class-checks``: a negative or non-integer budget is refused before any work, the
    message naming the option and the reason."""
    with pytest.raises(SystemExit) as e:
        main(["--class-checks", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--class-checks" in err and reason in err
