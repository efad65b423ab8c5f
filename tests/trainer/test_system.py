"""Rounds with deadlines (``[system]``, trainer/system.py, issue #46): who is left out, by hand."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
import torch

from edgemask.errors import ConfigError
from edgemask.mix import assign_boards
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.simulation import build_algorithm, simulate, train_clients

REPO = Path(__file__).resolve().parents[2]


def config(system: dict | None, rounds: int = 1, participation: float = 1.0, **training) -> TrainConfig:
    d = tomllib.loads((REPO / "configs" / "digits-fedavg.toml").read_text())
    d["training"].update(rounds=rounds, participation=participation, **training)
    d["data"]["num_clients"] = 6
    if system is not None:
        d["system"] = system
    return TrainConfig.from_dict(d, "t.toml")


def boards(fast_ms: float, slow_ms: float, **kw) -> dict:
    return {"deadline_s": 1.0, "bandwidth_kbps": 1e9, **kw,
            "boards": {"fast": {"share": 0.5, "step_ms": fast_ms}, "slow": {"share": 0.5, "step_ms": slow_ms}}}


def history(result) -> dict[tuple[int, str, str], float]:
    return {(r["round"], r["client"], r["metric"]): r["value"] for r in result.history}


def test_devices_past_the_deadline_are_left_out_of_the_aggregate():
    """Six digits devices, three on a board whose round takes ~hours: the global model after the round is the
    sample-weighted average of the three others' trained models, computed here from their local results."""
    cfg = config(boards(0.001, 1e6))
    res = simulate(cfg)
    on = assign_boards(list(res.algorithm.client_ids), {"fast": 0.5, "slow": 0.5}, cfg.run.seed)
    fast = sorted(c for c, b in on.items() if b == "fast")
    assert len(fast) == 3
    h = history(res)
    assert {c: h[(0, c, "dropped")] for c in on} == {c: 0.0 if b == "fast" else 1.0 for c, b in on.items()}
    assert h[(0, "server", "devices_dropped")] == 3 and h[(0, "server", "devices_selected")] == 6
    assert h[(0, "server", "round_time_s")] == 1.0  # fewer than K arrived: the server waited to the deadline
    # the same round trained again, averaged by hand over the fast devices only
    algo = build_algorithm(cfg)
    trained = dict(train_clients(algo, list(algo.client_ids), 0))
    n = {c: trained[c].num_samples for c in fast}
    for name, value in res.algorithm.global_params.items():
        want = sum(n[c] * trained[c].trained[name] for c in fast) / sum(n.values())
        torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6)
    assert res.summary["system"]["dropped_per_board"] == {"slow": 3}
    assert res.summary["system"]["device_boards"] == on


def test_over_commitment_keeps_the_first_k_to_finish():
    """K = ⌊6 · 0.5⌋ = 3; over-commitment 0.5 selects ⌈3 · 1.5⌉ = 5; the 3 fastest of them, by each device's steps
    × its board's step (computed here from the data sizes), are kept; the round ends at the third finisher."""
    sys_ = {"deadline_s": 1e4, "bandwidth_kbps": 1e9, "over_commit": 0.5,
            "boards": {"a": {"share": 0.5, "step_ms": 10.0}, "b": {"share": 0.5, "step_ms": 13.0}}}
    cfg = config(sys_, participation=0.5)
    res = simulate(cfg)
    h = history(res)
    selected = sorted(c for (r, c, m) in h if r == 0 and m == "dropped")
    assert len(selected) == 5
    on = assign_boards(list(res.algorithm.client_ids), {"a": 0.5, "b": 0.5}, cfg.run.seed)
    B, E = cfg.training.batch_size, cfg.training.local_epochs
    ds = res.algorithm.dataset
    step = {"a": 10.0, "b": 13.0}
    seconds = {c: math.ceil(len(ds.client(c).train_y) / B) * E * step[on[c]] / 1000 for c in selected}
    for c in selected:  # comm at 1 Tbit/s is below a microsecond
        assert h[(0, c, "local_round_s")] == pytest.approx(seconds[c], abs=1e-4)
    first = sorted(selected, key=lambda c: (seconds[c], c))[:3]
    assert sorted(c for c in selected if h[(0, c, "dropped")] == 0.0) == sorted(first)
    assert h[(0, "server", "round_time_s")] == pytest.approx(sorted(seconds.values())[2], abs=1e-4)


def test_a_round_no_device_finishes_keeps_the_servers_model():
    cfg = config(boards(1e6, 1e6))
    start = {k: v.clone() for k, v in build_algorithm(cfg).global_params.items()}
    res = simulate(cfg)
    for k, v in res.algorithm.global_params.items():
        assert torch.equal(v, start[k]), k
    assert history(res)[(0, "server", "devices_dropped")] == 6


def test_without_the_section_the_run_is_unchanged():
    """No [system]: no row added, the config written as before (history_hashes.py --check covers every config)."""
    cfg = config(None)
    assert "system" not in cfg.to_dict() and "[system]" not in cfg.to_toml()
    metrics = {r["metric"] for r in simulate(cfg).history}
    assert not metrics & {"dropped", "local_round_s", "round_time_s"}


def test_the_section_round_trips_through_the_written_config():
    cfg = config(boards(2.0, 3.0, over_commit=0.25))
    again = TrainConfig.from_dict(tomllib.loads(cfg.to_toml()), "config.toml")
    assert again.system == cfg.system


@pytest.mark.parametrize("system, words", [
    ({"boards": {"a": {"share": 1.0, "step_ms": 1.0}}}, "[system] deadline_s: missing"),
    ({"deadline_s": 1.0, "boards": {}}, "[system] boards: empty"),
    ({"deadline_s": 1.0, "boards": {"a": {"share": 0.5, "step_ms": 1.0}}}, "the shares add up to 0.5"),
    ({"deadline_s": float("nan"), "boards": {"a": {"share": 1.0, "step_ms": 1.0}}}, "nan is not a finite number"),
    ({"deadline_s": 1.0, "boards": {"a": {"share": 1.0}}}, "[system.boards.a] step_ms: missing"),
    ({"deadline_s": 1.0, "boards": {"a": {"share": 1.0, "step_ms": -1.0}}}, "[system.boards.a] step_ms: -1.0 is out"),
    ({"deadline_s": 1.0, "over_commit": -0.5, "boards": {"a": {"share": 1.0, "step_ms": 1.0}}}, "over_commit"),
])
def test_a_bad_section_is_one_line(system, words):
    with pytest.raises(ConfigError, match=None) as e:
        config(system)
    assert words in str(e.value) and str(e.value).startswith("t.toml: ")
