"""experiments.margin_wall: the balanced class split, dealt to GPUs, scored at every position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import experiments.margin_wall as MW
from optim.instance import load_instance

REPO = Path(__file__).resolve().parents[1]
S32 = REPO / "instances" / "small" / "small-32-llama-n48-g5-bimodal.json"


def test_the_balanced_split_of_small_32_gives_every_gpu_the_same_load():
    inst = load_instance(S32)
    split = MW.balanced_split(inst, 3)
    members = MW.class_members(inst)
    assert [sum(v[j] for v in split) for j in range(len(members))] == [len(m) for m in members]
    gpus = MW.deal(members, split)
    loads = [sum(inst.load_tps(a) for a in g) for g in gpus]
    assert max(loads) == pytest.approx(sum(loads) / 3, rel=1e-9)   # 12 heavy, 36 light: 4 + 12
    assert sorted(a.id for g in gpus for a in g) == sorted(a.id for a in inst.adapters)


def test_deal_gives_each_gpu_its_class_counts_with_interleaved_ids():
    inst = load_instance(S32)
    members = MW.class_members(inst)
    split = [[len(m) - 2 * (len(m) // 3) if i == 0 else len(m) // 3 for m in members]
             for i in range(3)]
    gpus = MW.deal(members, split)
    for g, v in zip(gpus, split):
        for j, m in enumerate(members):
            ids = {a.id for a in m}
            assert sum(a.id in ids for a in g) == v[j]
    # the first class's adapters go to the GPUs in turn
    first = members[0]
    assert [next(i for i, g in enumerate(gpus) if first[t] in g) for t in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="class 0"):
        MW.deal(members, [[v[0] + 1, *v[1:]] for v in split])


def test_best_order_and_draw_spread():
    S = np.array([[1.01, 0.99], [0.98, 1.02]])
    assert MW.best_order(S) == ((0, 1), pytest.approx(1.01))
    S = np.array([[0.99, 1.02], [1.03, 0.97]])
    order, low = MW.best_order(S)
    assert order == (1, 0) and low == pytest.approx(1.02)
    weakest, sd = MW.draw_spread(np.array([[0.99, 0.97], [1.00, 1.02]]))
    assert weakest == pytest.approx(0.98)
    assert sd == pytest.approx(np.sqrt(0.0002))


def test_bad_arguments_are_named(capsys):
    assert MW.main(["--instance", "small-32-llama-n48-g5-bimodal", "--gpus", "1"]) == 2
    assert "--gpus must be >= 2" in capsys.readouterr().err
    assert MW.main(["--instance", "no-such-instance", "--gpus", "2"]) == 2
    assert "no-such-instance" in capsys.readouterr().err
    assert MW.main(["--instance", "small-32-llama-n48-g5-bimodal", "--gpus", "2",
                    "--duration", "0"]) == 2
    assert "--duration must be > 0" in capsys.readouterr().err


def test_a_short_run_prints_its_verdict(capsys):
    assert MW.main(["--instance", "small-04-llama-n8-g3-lognormal", "--gpus", "2",
                    "--duration", "60", "--workers", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpus=2 accepted=")
    fields = dict(f.split("=") for f in last.split())
    assert set(fields) == {"gpus", "accepted", "best_order_min_score", "weakest_gpu_mean", "sd",
                           "spread_margin"}


def test_a_given_split_is_checked_against_the_classes(capsys):
    base = ["--instance", "small-32-llama-n48-g5-bimodal", "--gpus", "3"]
    assert MW.main(base + ["--split", "[[1, 2], [3]]"]) == 2
    assert "--split must be a JSON list of 3 lists of 4" in capsys.readouterr().err
    assert MW.main(base + ["--split", "[[9, 3, 15, 20], [0, 0, 0, 1], [0, 0, 0, 0]]"]) == 2
    assert "every GPU needs at least one adapter" in capsys.readouterr().err
    assert MW.main(base + ["--split", "[[9, 3, 15, 21], [0, 0, 0, 1], [0, 0, 0, 1]]"]) == 2
    assert "--split: class 3" in capsys.readouterr().err


def test_an_existing_csv_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "scores.csv"
    out.write_text("mine\n")
    assert MW.main(["--instance", "small-04-llama-n8-g3-lognormal", "--gpus", "2",
                    "--duration", "60", "--csv", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err and out.read_text() == "mine\n"
    assert MW.main(["--instance", "small-04-llama-n8-g3-lognormal", "--gpus", "2",
                    "--duration", "60", "--workers", "1", "--csv", str(out), "--force"]) == 0
    assert out.read_text().startswith("gpu,classes,")
