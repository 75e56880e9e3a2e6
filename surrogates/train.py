"""Fit every surrogate on a twin dataset and write a model directory.

Model directory layout (all plain JSON / npz; no pickles):

==========================  =======================================================
manifest.json               profile, profile hash, dataset metadata, split, metrics,
                            library versions, the command that regenerates the files
throughput.{json,npz}       ``models.ThroughputRegressor``
starvation.{json,npz}       ``models.StarvationClassifier``
itl.{json,npz}              ``models.ItlRegressor``
fast.{json,npz}             ``fast.FastModel`` (distilled)
capacity.json               ``encodable.CapacityModel`` (pieces)
==========================  =======================================================

The held-out split is by scenario (every Amax of a mix falls on the same side):
scenario ``i`` is a test scenario when ``split_u(seed, i) < test_frac``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dataset import load_dataset
from .domain import validate
from .encodable import CapacityModel
from .fast import FastModel
from .features import FEATURES
from .memory import KvTable
from .metrics import accuracy
from .model_files import read_json
from .models import ItlRegressor, StarvationClassifier, ThroughputRegressor

FULL_PARAMS = dict(max_iter=400, learning_rate=0.05, max_leaf_nodes=31, min_samples_leaf=20)
QUICK_PARAMS = dict(max_iter=40, learning_rate=0.2, max_leaf_nodes=15, min_samples_leaf=3)
CAPACITY_MIXES = 6000   # synthetic mixes labelled by the full models for the capacity model
FAST_PARAMS = dict(n_trees=80, depth=6, learning_rate=0.25)


def split_u(seed: int, scenario_ids: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) per scenario id, a pure function of (seed, id)."""
    ids = np.asarray(scenario_ids, dtype=np.int64)
    out = np.empty(len(ids))
    for k, i in enumerate(ids):
        out[k] = np.random.default_rng(np.random.SeedSequence([int(seed), 7919, int(i)])).random()
    return out


def test_mask(df, seed: int, test_frac: float) -> np.ndarray:
    ids = df["scenario_id"].to_numpy()
    uniq, inv = np.unique(ids, return_inverse=True)
    return split_u(seed, uniq)[inv] < test_frac


@dataclass
class Bundle:
    """Every model of a directory, loaded."""

    manifest: dict
    throughput: ThroughputRegressor
    starvation: StarvationClassifier
    itl: ItlRegressor
    fast: FastModel
    capacity: CapacityModel


def load_bundle(model_dir: str | os.PathLike) -> Bundle:
    d = Path(model_dir)
    if not d.is_dir():
        raise ValueError(f"model: {d} is not a directory (expected a trained model directory)")
    manifest = read_json(d / "manifest.json", "model manifest")
    try:
        from .dataset import profile_hash
        cur = profile_hash(str(manifest.get("profile")))
        if cur != manifest.get("profile_hash"):
            import warnings
            warnings.warn(f"{d}: trained on twin data of profile hash {manifest.get('profile_hash')}, "
                          f"the current profile is {cur}: regenerate (see manifest 'regenerate')",
                          stacklevel=2)
    except (OSError, ValueError):
        pass
    return Bundle(manifest, ThroughputRegressor.load(d / "throughput"),
                  StarvationClassifier.load(d / "starvation"), ItlRegressor.load(d / "itl"),
                  FastModel.load(d / "fast"), CapacityModel.load(d / "capacity.json"))


def fit_capacity(M, starved, thr, kv, seed: int, teacher=None, n_mixes: int = 0,
                 ranks=None) -> tuple[CapacityModel, dict]:
    """Fit the capacity model on twin rows plus (if ``teacher=(thr_model, starve_model)`` and
    ``n_mixes > 0``) synthetic in-domain rows labelled by the full models (distillation: the
    pieces are many, the twin rows few). The x feature is chosen by accuracy on held-back twin
    rows."""
    rng = np.random.default_rng(seed)
    inner = rng.random(len(M)) < 0.25
    SM = np.zeros((0, M.shape[1]))
    s_st = np.zeros(0, bool)
    s_thr = np.zeros(0)
    if teacher is not None and n_mixes > 0:
        from .dataset import synthetic_feature_rows
        t_thr, t_st = teacher
        SM = validate(synthetic_feature_rows(seed, n_mixes, ranks or (8, 16, 32)))
        SM = SM[~t_thr.domain_.flags(SM)]
        s_thr, _ = t_thr.predict_with_flags(SM)
        s_st, _ = t_st.predict_with_flags(SM)
    scores = {}
    for xf in ("n", "busy5", "busy30"):
        m = CapacityModel(kv_capacity=kv, x_feature=xf).fit(
            np.vstack([M[~inner], SM]), np.concatenate([starved[~inner], s_st]),
            np.concatenate([thr[~inner], s_thr]))
        _, feas, ood = m.predict_with_flags(M[inner])
        scores[xf] = accuracy(~starved[inner][~ood], feas[~ood]) if (~ood).any() else 0.0
    best = max(scores, key=scores.get)
    scores["synthetic_rows"] = int(len(SM))
    return CapacityModel(kv_capacity=kv, x_feature=best).fit(
        np.vstack([M, SM]), np.concatenate([starved, s_st]), np.concatenate([thr, s_thr])), scores


def train_all(data: str | os.PathLike, out: str | os.PathLike, seed: int = 0,
              test_frac: float = 0.2, quick: bool = False, allow_stale_profile: bool = False,
              log=print) -> dict:
    if not 0.0 <= test_frac < 1.0:
        raise ValueError(f"test_frac: must be in [0, 1), got {test_frac!r}")
    from twin.profile import load_profile
    df = load_dataset(data)
    meta = df.attrs.get("meta", {})
    prof_name = meta.get("profile")
    if not prof_name:
        raise ValueError(f"data: {data} has no profile in its metadata")
    from .dataset import profile_hash
    stale = meta.get("profile_hash") != profile_hash(prof_name)
    if stale and allow_stale_profile:
        log(f"warning: training on data simulated with profile hash {meta.get('profile_hash')}; "
            f"the current profile is {profile_hash(prof_name)} (manifest marks it stale)")
    elif stale:
        raise ValueError(f"data: profile_hash {meta.get('profile_hash')} of {data} differs from "
                         f"the current profile {prof_name!r} ({profile_hash(prof_name)}): the "
                         "twin was recalibrated since the build; rebuild the dataset")
    from .dataset import twin_source_hash
    if meta.get("twin_hash") not in (None, twin_source_hash()):
        log(f"warning: the twin's code changed since {data} was built (twin_hash "
            f"{meta.get('twin_hash')} vs {twin_source_hash()}); consider rebuilding")
    kv = KvTable.from_profile(load_profile(prof_name)).to_json()
    te = test_mask(df, seed, test_frac)
    tr = ~te
    M = validate(df)
    params = QUICK_PARAMS if quick else FULL_PARAMS
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings = {}
    t0 = time.perf_counter()
    thr_m = ThroughputRegressor(kv_capacity=kv, random_state=seed, **params).fit(
        M[tr], df["throughput_tps"].to_numpy()[tr])
    timings["throughput_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cls_params = dict(params, max_iter=max(20, int(params["max_iter"] * 0.6)))
    st_m = StarvationClassifier(kv_capacity=kv, random_state=seed, **cls_params).fit(
        M[tr], df["starved"].to_numpy()[tr])
    timings["starvation_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    itl_m = ItlRegressor(kv_capacity=kv, random_state=seed, **cls_params).fit(
        M[tr], df["mean_itl_ms"].to_numpy()[tr])
    timings["itl_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fp = dict(FAST_PARAMS) if not quick else dict(n_trees=10, depth=4, learning_rate=0.3)
    fast_m = FastModel.distill(thr_m, st_m, M[tr], n_synthetic=0 if quick else 2 * int(tr.sum()),
                               seed=seed, **fp)
    timings["fast_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cap_m, cap_scores = fit_capacity(M[tr], df["starved"].to_numpy()[tr] | df["memory_error"].to_numpy()[tr],
                                     df["throughput_tps"].to_numpy()[tr], kv, seed,
                                     teacher=(thr_m, st_m), n_mixes=0 if quick else CAPACITY_MIXES,
                                     ranks=tuple(meta.get("supported_ranks", (8, 16, 32))))
    timings["capacity_s"] = time.perf_counter() - t0
    thr_m.save(out / "throughput")
    st_m.save(out / "starvation")
    itl_m.save(out / "itl")
    fast_m.save(out / "fast")
    cap_m.save(out / "capacity.json")
    import sklearn
    manifest = {
        "profile": prof_name, "profile_hash": meta.get("profile_hash"),
        "stale_profile": bool(stale), "current_profile_hash_at_training": profile_hash(prof_name),
        "dataset": {"path": str(data), "rows": int(len(df)),
                    "scenarios": int(df["scenario_id"].nunique()), "meta": meta},
        "split": {"seed": seed, "test_frac": test_frac, "rule": "split_u(seed, scenario_id) < test_frac",
                  "train_rows": int(tr.sum()), "test_rows": int(te.sum())},
        "params": {"full": params, "classifier_itl": cls_params, "fast": fp,
                   "capacity_x_feature": cap_m.x_feature, "capacity_inner_accuracy": cap_scores},
        "features": list(FEATURES),
        "fit_seconds": {k: round(v, 2) for k, v in timings.items()},
        "versions": {"python": sys.version.split()[0], "numpy": np.__version__,
                     "scikit-learn": sklearn.__version__},
        "regenerate": [
            f"python -m surrogates build --profile {prof_name} --samples "
            f"{int(df['scenario_id'].max()) + 1} --out {data} --seed {meta.get('seed')} "
            f"--workers 2",
            f"python -m surrogates train --data {data} --out {out} --seed {seed} "
            f"--test-frac {test_frac}" + (" --quick" if quick else ""),
        ],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(f"train: wrote {out} (train rows {int(tr.sum())}, test rows {int(te.sum())}, "
        f"capacity x={cap_m.x_feature}, fit s: " +
        ", ".join(f"{k}={v:.1f}" for k, v in timings.items()) + ")")
    return manifest
