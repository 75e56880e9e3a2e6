"""``optim.capacity._bisect_limits``: the bracket of a carry limit far below its guess."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import optim.capacity as C


def _fake(monkeypatch, limit_of):
    """``_unstarved`` replaced: a load passes when it is at most ``limit_of(amax, seed)``;
    returns the loads probed, in order."""
    probes: list[float] = []

    def unstarved(prof, rank, n, jobs, lengths, duration_s, threshold, pool, slo=None):
        out = []
        for amax, load, seed in jobs:
            probes.append(load)
            out.append(load <= limit_of(amax, seed))
        return out
    monkeypatch.setattr(C, "_unstarved", unstarved)
    return probes


@pytest.mark.parametrize("frac", [0.7, 0.3, 0.01])
def test_a_limit_below_half_the_guess_is_found(monkeypatch, frac):
    """Without an SLO the bracket steps down by 1 % to half the guess, as it always did, and
    on from there in ``SLO_BRACKET_STEP`` steps (a short window puts the limit far down):
    the limit is found within the bisection's resolution wherever it lies."""
    guess = 1000.0
    probes = _fake(monkeypatch, lambda a, s: frac * guess)
    prof = SimpleNamespace(name="p")
    got = C._bisect_limits(prof, 8, 1, [(4, 0)], guess, None, 60.0, 0.9, None)
    assert got[0] == pytest.approx(frac * guess, rel=2 * C.LIMIT_RTOL)
    # the bracket: 1 % steps down to (just past) half the guess, as before; then 25 % steps
    passed = next(i for i, p in enumerate(probes) if p <= frac * guess)
    below = next((i for i, p in enumerate(probes) if p < 0.5 * guess), passed)
    last = min(passed, below)
    assert probes[:last + 1] == pytest.approx([guess / 1.01 ** k for k in range(last + 1)])
    steps = [a / b for a, b in zip(probes[last:passed], probes[last + 1:passed + 1])]
    assert steps == pytest.approx([C.SLO_BRACKET_STEP] * len(steps))


def test_a_load_starved_at_every_bracket_step_names_the_window(monkeypatch):
    """A load starved at every step down to 1e-4 x the guess is an error that states the
    loads tried and the twin window, not "any load"."""
    _fake(monkeypatch, lambda a, s: 0.0)
    with pytest.raises(ValueError) as e:
        C._bisect_limits(SimpleNamespace(name="p"), 8, 3, [(4, 0)], 1000.0, None, 60.0, 0.9,
                         None)
    msg = str(e.value)
    assert "3 adapter(s) of rank 8 starve at every load down to 0.1 tok/s" in msg
    assert "60 s twin window" in msg
