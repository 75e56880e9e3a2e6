"""The per-process cache of Poisson draws in ``twin.server.simulate_server``: a replay that
reuses a draw gives bit-identical metrics, and any input of the draw changes the key."""

from __future__ import annotations

import twin.server as S
from twin.profile import load_profile
from twin.workload import Adapter


def _metrics(ads, seed=1, dur=600.0, amax=4):
    m = S.simulate_server(load_profile("llama-3.1-8b-instruct"), ads, S.ServerConfig(max_loras=amax),
                          dur, seed=seed).to_dict()
    m.pop("wall_s")
    return m


def test_reused_draw_gives_identical_metrics():
    ads = [Adapter(f"a{i}", 8, 0.4) for i in range(12)]
    S._DRAWS.clear()
    first = _metrics(ads)
    assert len(S._DRAWS) == 1
    again = _metrics(ads)                               # from the cache
    other_amax = _metrics(ads, amax=8)                  # same draw, other configuration
    assert len(S._DRAWS) == 1
    S._DRAWS.clear()
    assert _metrics(ads) == first == again
    assert _metrics(ads, amax=8) == other_amax


def test_every_input_of_the_draw_is_in_the_key():
    ads = [Adapter(f"a{i}", 8, 0.4) for i in range(6)]
    S._DRAWS.clear()
    base = _metrics(ads)
    variants = [_metrics(ads, seed=2), _metrics(ads, dur=300.0),
                _metrics([Adapter(a.id, a.rank, a.rate * 1.5) for a in ads]),
                _metrics([Adapter(a.id + "x", a.rank, a.rate) for a in ads])]
    assert all(v["arrived_requests"] != base["arrived_requests"] or v != base for v in variants)
    assert len(S._DRAWS) <= S.DRAW_CACHE_ENTRIES
