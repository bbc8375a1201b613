"""bench_peers.py's systems as a user names them: a sweep of the peer's learning rate in one call, and a
misspelt system stopped before any run spends its budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.bench_peers import peer_rate, systems_to_run, time_to_reach


def test_each_system_of_a_sweep_runs_at_its_own_rate_and_levers_add_their_flags():
    args = SimpleNamespace(systems=["ours", "fhv", "fhv@lr", "fhv@2e-3", "fhv@4e-3"], levers=["lr8e-3", "clip1+dur8"])
    names = dict(systems_to_run(args))
    assert list(names) == ["ours", "fhv", "fhv@lr", "fhv@2e-3", "fhv@4e-3", "ours+lr8e-3", "ours+clip1+dur8"]
    assert names["ours+lr8e-3"] == ["--learning_rate", "8e-3"]
    assert names["ours+clip1+dur8"] == ["--max_grad_norm", "1", "--duration_loss_weight", "8"]
    rates = {name: peer_rate(name, 1e-3) for name in names if name.startswith("fhv")}
    assert rates == {"fhv": None, "fhv@lr": 1e-3, "fhv@2e-3": 2e-3, "fhv@4e-3": 4e-3}


@pytest.mark.parametrize(
    "systems, levers, said",
    [
        (["fhv@fast"], [], "no number"),
        (["piper"], [], "unknown"),
        (["ours"], ["lr3"], "unknown"),
    ],
)
def test_a_misspelt_system_or_lever_stops_before_any_run(systems, levers, said):
    with pytest.raises(SystemExit, match=said):
        systems_to_run(SimpleNamespace(systems=systems, levers=levers))


def test_the_time_to_a_quality_is_interpolated_between_the_curve_s_points():
    curve = [(3.0, 9.0), (40.0, 7.0), (80.0, 6.6), (120.0, 5.9), (160.0, 6.5)]
    first_point, estimate = time_to_reach(curve, 6.25)
    assert first_point == 120.0 and estimate == pytest.approx(100.0)  # halfway from 6.6 to 5.9
    assert time_to_reach(curve, 9.5) == (3.0, 3.0)  # the start is already there
    assert time_to_reach(curve, 5.0) is None
