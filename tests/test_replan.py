"""Churn-aware re-planning (optim.replan, ``python -m optim replan``)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from optim.cli import main
from optim.instance import instance_from_dict
from optim.placement import Placement, plan_gpu
from optim.replan import (ReplanOptions, carry_over, choose, choose_by_transition, churn_between,
                          relabel, replan, replay_transition, ReplanResult, Churn,
                          TransitionReport)
from optim.verify import verify
from twin.workload import Adapter

LLAMA = "llama-3.1-8b-instruct"
DUR = 240.0


def _inst(adapters, name="rp"):
    return instance_from_dict({
        "name": name, "adapters": [{"id": a.id, "rank": a.rank, "rate": a.rate}
                                   for a in adapters],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 8}], "duration_s": DUR, "seed": 5})


def _three_gpu_plan():
    """12 light adapters on 3 GPUs (4 each), verified."""
    ads = [Adapter(f"a{i}", 8, 1.0) for i in range(12)]
    inst = _inst(ads)
    gpus = tuple(plan_gpu("h100", LLAMA, 4, [(a, 1.0) for a in ads[4 * g:4 * g + 4]],
                          inst.mean_tokens) for g in range(3))
    p = verify(Placement(inst.name, "manual", "solved", gpus), inst, workers=1)
    assert p.verdict == "accepted"
    return inst, p


@pytest.fixture(scope="module")
def base():
    return _three_gpu_plan()


def _homes(p):
    return {i: {a.id for a, _ in g.adapters} for i, g in enumerate(p.gpus)}


def test_unchanged_instance_means_zero_churn(base):
    inst, p = base
    # no optional moves allowed: the plan stays as it is
    r = replan(p, inst, ReplanOptions(duration_s=DUR, workers=1, max_moves=0))
    assert r.churn == Churn(0, 0, 0, 0, 0, 0, 3)
    assert r.placement.verdict == "accepted" and r.candidate == "incremental"
    assert _homes(r.placement) == _homes(p)
    # a solver's plan (greedy, twin repair and compaction) at the default churn weight
    from optim.methods import solve
    solved = solve(inst, "greedy", verify=True, duration_s=DUR, workers=1)
    assert solved.verdict == "accepted"
    r = replan(solved, inst, ReplanOptions(duration_s=DUR, workers=1), fresh=solved)
    assert r.churn.moves == 0 and r.churn.loads == 0 and r.churn.gpus_removed == 0
    assert r.placement.verdict == "accepted"


def test_slack_is_drained_when_moves_are_cheap(base):
    inst, p = base
    r = replan(p, inst, ReplanOptions(duration_s=DUR, workers=1, churn_weight=0.0))
    assert r.placement.verdict == "accepted"
    assert r.placement.n_gpus < p.n_gpus and r.churn.gpus_removed >= 1
    assert r.churn.moves == r.churn.loads > 0


def test_rate_bump_moves_only_the_starving_gpus_adapters(base):
    inst, p = base
    # a5 at 36 req/s (15.1k tok/s): GPU 1 starves where it is (it carries 14.2k of 16.4k)
    hot = [replace(a, rate=36.0) if a.id == "a5" else a for a in inst.adapters]
    new = _inst(hot)
    # no optional moves: only those that stop starvation
    r = replan(p, new, ReplanOptions(duration_s=DUR, workers=1, max_moves=0))
    q = r.placement
    assert q.verdict == "accepted"
    # the twin re-verifies the result on its own: accepted
    assert verify(q.with_(verdict=None), new, workers=1).verdict == "accepted"
    old = _homes(p)
    moved = set()
    for j, o in enumerate(r.origin):
        ids = {a.id for a, _ in q.gpus[j].adapters}
        if o is not None:
            moved |= ids - old[o]
        else:
            moved |= ids
    assert moved and moved <= old[1]                     # only GPU 1's adapters moved
    assert r.churn.moves == len(moved)
    for o in (0, 2):                                     # the other GPUs kept all theirs
        j = r.origin.index(o)
        assert old[o] <= {a.id for a, _ in q.gpus[j].adapters}


def test_retired_and_new_adapters(base):
    inst, p = base
    ads = [a for a in inst.adapters if a.id != "a0"] + [Adapter("n1", 8, 1.0)]
    new = _inst(ads)
    gpus, origin, homeless, _ = carry_over(p, new)
    assert [a.id for a in homeless] == ["n1"] and origin == [0, 1, 2]
    assert "a0" not in {a.id for g in gpus for a, _ in g.adapters}
    r = replan(p, new, ReplanOptions(duration_s=DUR, workers=1, max_moves=0))
    assert r.placement.verdict == "accepted"
    assert r.churn.moves == 0 and r.churn.loads == 1 and r.churn.unloads == 1
    trans = r.placement.params["replan"]["transition"]   # a0 served until the switch, n1 after
    assert trans["new_homes"] == 1 and not trans["starved"]


def test_relabel_maximises_overlap_against_brute_force():
    def gpu(ids):
        return plan_gpu("h100", LLAMA, 2, [(Adapter(i, 8, 1.0), 1.0) for i in ids], 400.0)
    prev = Placement("x", "m", "solved", (gpu("abc"), gpu("def"), gpu("ghi"), gpu("jk")))
    new = (gpu("dgh"), gpu("abe"), gpu("ijk"), gpu("cf"), gpu("l"))
    origin = relabel(prev, new)

    def overlap(orig):
        return sum(len({a.id for a, _ in new[j].adapters} &
                       {a.id for a, _ in prev.gpus[o].adapters})
                   for j, o in enumerate(orig) if o is not None)
    best = max(overlap(list(perm[:len(new)])) for perm in
               itertools.permutations(list(range(prev.n_gpus)) + [None] * len(new)))
    assert overlap(origin) == best
    c = churn_between(prev, new, origin)
    assert c.gpus_added == 1 and c.gpus_removed == 0 and c.kept_gpus == 4
    assert c.loads == sum(len(g.adapters) for g in new) - best


def _candidate(gpus, moves, name, verdict="accepted"):
    """A candidate of ``gpus`` one-adapter GPUs and ``moves`` adapter moves."""
    p = Placement("x", "m", "solved", tuple(
        plan_gpu("h100", LLAMA, 1, [(Adapter(f"{name}{i}", 8, 1.0), 1.0)], 400.0)
        for i in range(gpus)), verdict=verdict)
    return ReplanResult(p, Churn(moves, moves, 0, 0, 0, 0, gpus), (None,) * gpus, name)


def test_choose_respects_the_budget():
    inc, fresh = _candidate(5, 2, "incremental"), _candidate(4, 40, "resolve")
    assert choose([inc, fresh], ReplanOptions(churn_weight=0.01)).candidate == "resolve"
    assert choose([inc, fresh], ReplanOptions(churn_weight=0.1)).candidate == "incremental"
    assert choose([inc, fresh], ReplanOptions(max_moves=10)).candidate == "incremental"
    assert choose([inc, fresh], ReplanOptions(max_moves=50)).candidate == "resolve"
    bad = _candidate(3, 0, "incremental", verdict="rejected")
    assert choose([bad, fresh], ReplanOptions(churn_weight=1.0)).candidate == "resolve"


def _report(late, starved, unfinished=0, worst=0.95):
    return TransitionReport(120.0, 420.0, 1000, late, 0, unfinished, 0, 1.0, 1.0, 1.0, worst,
                            0.95, 0, 0, 0.0, 0.0, starved, "staggered")


def test_choose_weighs_the_switch_over():
    inc, fresh = _candidate(5, 2, "incremental"), _candidate(4, 40, "resolve")
    # resolve is cheaper (4.4 vs 5.02 GPUs); a clean switch-over is worth up to 1 GPU here
    opts = ReplanOptions(churn_weight=0.01, switch_allowance=1.0)
    calls = []

    def replay(reports):
        def f(c):
            calls.append(c.candidate)
            return reports[c.candidate]
        return f
    # the cheaper candidate's switch-over starves, the other's does not: the other wins
    best, reps, note = choose_by_transition(
        [inc, fresh], opts,
        replay({"resolve": _report(50, True), "incremental": _report(0, False)}))
    assert best.candidate == "incremental" and not note and calls == ["resolve", "incremental"]
    # the cheaper one does not starve: taken, the other is not replayed
    calls.clear()
    best, reps, note = choose_by_transition(
        [inc, fresh], opts, replay({"resolve": _report(0, False), "incremental": _report(9, True)}))
    assert best.candidate == "resolve" and calls == ["resolve"] and set(reps) == {"resolve"}
    # both starve: the least damaging (late + unfinished beyond steady state), said in the note
    best, reps, note = choose_by_transition(
        [inc, fresh], opts, replay({"resolve": _report(10, True, unfinished=5),
                                    "incremental": _report(12, True)}))
    assert best.candidate == "incremental" and "least damaging, 'incremental'" in note
    # the default allowance (0.25 GPU) does not buy the dearer candidate's clean switch-over
    calls.clear()
    best, reps, note = choose_by_transition(
        [inc, fresh], ReplanOptions(churn_weight=0.01),
        replay({"resolve": _report(50, True), "incremental": _report(0, False)}))
    assert best.candidate == "resolve" and calls == ["resolve"] and "within 0.25 GPU" in note
    # a twin-rejected candidate never wins over an accepted one, whatever its switch-over
    bad = _candidate(3, 0, "incremental", verdict="rejected")
    best, _, note = choose_by_transition(
        [bad, fresh], ReplanOptions(churn_weight=1.0),
        replay({"resolve": _report(40, True), "incremental": _report(0, False)}))
    assert best.candidate == "resolve" and "resolve" in note


def test_options_are_checked():
    with pytest.raises(ValueError, match="churn_weight"):
        ReplanOptions(churn_weight=-1)
    with pytest.raises(ValueError, match="max_moves"):
        ReplanOptions(max_moves=-2)
    with pytest.raises(ValueError, match="switch_schedule"):
        ReplanOptions(switch_schedule="slow")
    with pytest.raises(ValueError, match="switch_allowance"):
        ReplanOptions(switch_allowance=-0.1)


def test_cli_switch_schedules_are_the_library_ones():
    from optim.cli_deploy import CLI_SWITCH_SCHEDULES
    from optim.replan import SWITCH_ALLOWANCE, SWITCH_SCHEDULES
    assert CLI_SWITCH_SCHEDULES == SWITCH_SCHEDULES and SWITCH_ALLOWANCE == 0.25   # --help


def test_cli_replan_end_to_end_and_errors(tmp_path, capsys, base):
    inst, p = base
    prev = tmp_path / "prev.json"
    prev.write_text(p.to_json())
    ip = tmp_path / "inst.json"
    ip.write_text(json.dumps(inst.to_dict()))
    out = tmp_path / "new.json"
    rc = main(["replan", str(ip), "--previous", str(prev), "--no-resolve", "--workers", "1",
               "--max-moves", "0", "--json", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "churn: moves=0 loads=0" in text and "verdict=accepted" in text
    rec = json.loads(out.read_text())
    assert rec["method"] == "replan" and rec["params"]["replan"]["churn"]["moves"] == 0
    trans = rec["params"]["replan"]["transition"]       # the switch-over was replayed
    assert trans["new_homes"] == 0 and trans["late"] == 0 and not trans["starved"]
    assert trans["requests"] > 1000
    assert f"switch-over (replayed in the routed fleet twin): schedule={trans['schedule']} " \
           "starved=False late=0" in text
    # the switch-over options reach the re-plan; without the replay there is no switch-over line
    rc = main(["replan", str(ip), "--previous", str(prev), "--no-resolve", "--workers", "1",
               "--max-moves", "0", "--json", str(out), "--force", "--quiet",
               "--switch-schedule", "abrupt", "--switch-allowance", "0"])
    assert rc == 0 and "schedule=abrupt" in capsys.readouterr().out
    assert json.loads(out.read_text())["params"]["replan"]["transition"]["schedule"] == "abrupt"
    rc = main(["replan", str(ip), "--previous", str(prev), "--no-resolve", "--workers", "1",
               "--max-moves", "0", "--quiet", "--no-transition"])
    assert rc == 0 and "switch-over" not in capsys.readouterr().out
    for bad in (["--switch-schedule", "slow"], ["--switch-allowance", "-1"]):
        with pytest.raises(SystemExit):
            main(["replan", str(ip), "--previous", str(prev), *bad])
        assert bad[0] in capsys.readouterr().err
    assert main(["replan", str(ip), "--previous", str(prev), "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replan", str(ip), "--previous", str(prev), "--churn-weight", "0.1",
              "--max-moves", "3"])
    assert "not allowed with" in capsys.readouterr().err
    assert main(["replan", str(ip), "--previous", str(tmp_path / "nope.json")]) == 2
    assert "--previous" in capsys.readouterr().err


def test_transition_replay_pays_loads_drains_and_restarts(base):
    inst, p = base
    same = replay_transition(p, p.gpus, (0, 1, 2), inst)
    assert same.new_homes == 0 and same.restarts == 0 and same.max_drain_s == 0.0
    assert same.late == same.late_steady == 0 and same.unfinished == 0 and not same.starved
    assert same.min_gpu_throughput_over_offered > 0.95
    assert same.throughput_over_offered > 0.95 and same.requests > 3000
    # three adapters of GPU 0 move to GPU 1, whose 4 slots then serve 7 adapters: the old home
    # drains, the new one loads them, and the twin shows the transition starving, later than
    # the new plan's own steady state
    g = list(p.gpus)
    a0 = list(g[0].adapters)
    g[0] = plan_gpu("h100", LLAMA, 4, a0[:1], inst.mean_tokens)
    g[1] = plan_gpu("h100", LLAMA, 4, list(g[1].adapters) + a0[1:], inst.mean_tokens)
    moved = replay_transition(p, g, (0, 1, 2), inst)
    assert moved.new_homes == 3 and moved.restarts == 0
    assert moved.max_drain_s > 0.0 and moved.late > moved.late_steady > 0 and moved.starved
    # GPU 2 restarts with Amax 8: its old server drains, the new one starts cold after it
    # (abrupt: its requests wait for it; gentle: they go to the other GPUs meanwhile)
    g = list(p.gpus)
    g[2] = plan_gpu("h100", LLAMA, 8, list(g[2].adapters), inst.mean_tokens)
    rs = replay_transition(p, g, (0, 1, 2), inst, schedule="abrupt")
    assert rs.restarts == 1 and rs.new_homes == 4 and rs.max_restart_wait_s > 0.0
    assert rs.max_restart_wait_s >= rs.max_drain_s - 1.0 and not rs.starved
    assert rs.p99_ttft_s > same.p99_ttft_s          # the restart costs its requests
    assert rs.waited > 0 and rs.bridged == 0 and rs.schedule == "abrupt"
    (_, _, begin, up), = rs.restart_schedule
    assert begin == 0.0 and up > 0.0
    gs = replay_transition(p, g, (0, 1, 2), inst)
    assert gs.schedule == "staggered" and [t[0] for t in gs.tried] == ["staggered"]  # 1 restart
    assert gs.bridged > 0 and not gs.starved and gs.p99_ttft_s <= rs.p99_ttft_s
    # two restarts: auto replays them one at a time and both at once, keeps the better
    g[1] = plan_gpu("h100", LLAMA, 8, list(g[1].adapters), inst.mean_tokens)
    two = replay_transition(p, g, (0, 1, 2), inst)
    assert [t[0] for t in two.tried] == ["staggered", "parallel"] and two.restarts == 2
    assert (two.starved,) + two.damage() == min(t[1:] for t in two.tried)
    (_, _, b1, u1), (_, _, b2, u2) = two.restart_schedule
    if two.schedule == "staggered":
        assert min(u1, u2) <= max(b1, b2)                   # never two restarting at once
    else:
        assert b1 == b2 == 0.0
    assert two.to_dict()["tried"].keys() == {"staggered", "parallel"}
    with pytest.raises(ValueError, match="schedule"):
        replay_transition(p, p.gpus, (0, 1, 2), inst, schedule="gentle")
    with pytest.raises(ValueError, match="origin"):
        replay_transition(p, p.gpus, (0, 1), inst)
    with pytest.raises(ValueError, match="warmup_s"):
        replay_transition(p, p.gpus, (0, 1, 2), inst, warmup_s=0.0)


def test_a_gentle_switch_spares_a_restart_the_wait_for_its_drain(base):
    # the previous plan left GPU 2 (Amax 4) overloaded: its adapters ran at 12 req/s; the new
    # plan serves them at 1 req/s on GPU 2 restarted with Amax 8. Abruptly, their requests
    # wait for the old instance's backlog to drain (late, the switch starves); gently, they go
    # to GPUs 0 and 1 (free slots, short queues) until the new server is up
    inst, _ = base
    ads = list(inst.adapters)
    hot = [(replace(a, rate=12.0), 1.0) for a in ads[8:]]
    light = [[(a, 1.0) for a in ads[4 * g:4 * g + 4]] for g in (0, 1)]
    prev = Placement(inst.name, "manual", "solved", (
        plan_gpu("h100", LLAMA, 8, light[0], inst.mean_tokens),
        plan_gpu("h100", LLAMA, 8, light[1], inst.mean_tokens),
        plan_gpu("h100", LLAMA, 4, hot, inst.mean_tokens)))
    new = prev.gpus[:2] + (plan_gpu("h100", LLAMA, 8, [(a, 1.0) for a in ads[8:]],
                                    inst.mean_tokens),)
    abrupt = replay_transition(prev, new, (0, 1, 2), inst, schedule="abrupt")
    gentle = replay_transition(prev, new, (0, 1, 2), inst)
    assert abrupt.restarts == gentle.restarts == 1
    assert abrupt.starved and abrupt.late > 50 and abrupt.late_steady == 0
    assert abrupt.max_restart_wait_s > 30.0           # the drain of the backlog
    assert not gentle.starved and gentle.late == 0 and gentle.bridged > 50
    (j, o, begin, up), = gentle.restart_schedule
    assert (j, o, begin) == (2, 2, 0.0) and up > 30.0
