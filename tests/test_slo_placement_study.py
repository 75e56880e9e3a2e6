"""``experiments.slo_placement --rebound``: stored points get the current code's bound."""

from __future__ import annotations

from types import SimpleNamespace

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

    def point_bound(inst_, bound, counts, duration_s, workers):
        seen["counts"] = counts
        return 3
    monkeypatch.setattr(G, "point_bound", point_bound)
    store = RowStore(tmp_path / "rows.jsonl")
    out = S.rebound_point(inst, ["greedy", "loraserve"], rows, 600.0, 1, store)
    assert seen["counts"] == [3, 4]
    assert [r["lb"] for r in out] == [3, 3] and [r["gpus"] for r in out] == [3, 4]
    key = S.point_key(inst, "greedy", 600.0, S.MAX_EXTRA, 0)
    assert RowStore(tmp_path / "rows.jsonl").get(key)["lb"] == 3
    monkeypatch.setattr(G, "point_bound", lambda *a, **k: 3)
    before = (tmp_path / "rows.jsonl").read_text()
    S.rebound_point(inst, ["greedy", "loraserve"], out, 600.0, 1, store)
    assert (tmp_path / "rows.jsonl").read_text() == before        # nothing changed: no write
