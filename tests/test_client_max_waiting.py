"""The load generator's waiting-request cap: ``ServerConfig.client_max_waiting`` and
``twin run --client-max-waiting``."""

from __future__ import annotations

import json

import pytest

from twin.cli import main
from twin.profile import load_profile
from twin.server import SHARED_BENCHMARK_CLIENT_MAX_WAITING, ServerConfig, simulate_server
from twin.workload import adapters_from_cycles

OVERLOAD = dict(duration_s=120.0, seed=0)


def _overloaded(cap):
    prof = load_profile("llama-3.1-8b-instruct")
    adapters = adapters_from_cycles(64, [8], [3.2])
    return simulate_server(prof, adapters, ServerConfig(max_loras=8, client_max_waiting=cap),
                           **OVERLOAD)


def test_cap_bounds_the_queue_and_rejects_the_rest():
    free = _overloaded(None)
    capped = _overloaded(50)
    assert free.rejected_requests == 0 and free.max_waiting > 50
    assert capped.max_waiting <= 50 and capped.rejected_requests > 0
    # rejected requests stay in the offered load: the capped server starves as well
    assert capped.offered_realised_tps == free.offered_realised_tps and capped.starved


def test_shared_benchmark_constant():
    assert SHARED_BENCHMARK_CLIENT_MAX_WAITING == 25_500


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_config_rejects_bad_cap(bad):
    with pytest.raises(ValueError, match="client_max_waiting"):
        ServerConfig(max_loras=8, client_max_waiting=bad)


def test_cli_option(tmp_path, capsys):
    out = tmp_path / "run.json"
    args = ["run", "--adapters", "64", "--ranks", "8", "--rates", "3.2", "--amax", "8",
            "--duration", "120", "--json", str(out)]
    assert main(args + ["--client-max-waiting", "50"]) == 0
    d = json.loads(out.read_text())
    assert d["configuration"]["client_max_waiting"] == 50
    assert d["max_waiting"] <= 50 and d["rejected_requests"] > 0
    assert "rejected" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_cli_rejects_bad_cap(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--client-max-waiting", bad])
    assert e.value.code != 0
    assert "--client-max-waiting" in capsys.readouterr().err
