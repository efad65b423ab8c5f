"""PerFedMask's P^mask: the bound's parameter-weighted second term (default) vs the poster's printed one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgemask.trainer.algorithms.perfedmask import pmask_objective, solve_pmask


def test_printed_objective_weighs_every_layer_one_by_hand():
    """Two layers of 10 and 1 parameters, device 0 trains layer 0, device 1 both; ψ = (10, 11), no slack.
    k̃ = ((.5, 0), (.5, 1)), d_w = 11, max_j k̃ = (.5, 1). Bound: Σ_j |π_j| k̃ = (5, 6), objective 5.5 − 5 + 11 − 6 =
    5.5. Printed: Σ_j k̃ = (.5, 1.5), objective 5.5 − .5 + 11 − 1.5 = 14.5."""
    m = np.array([[1, 0], [1, 1]])
    sizes, psi = np.array([10.0, 1.0]), np.array([10.0, 11.0])
    assert pmask_objective(m, sizes, psi) == pytest.approx(5.5)
    assert pmask_objective(m, sizes, psi, np.ones(2)) == pytest.approx(14.5)


def test_solver_minimizes_the_chosen_objective():
    """Every binary choice of a 2-device, 3-layer case enumerated: the solver's choice is the minimum of the
    objective it was asked for, under the budgets."""
    sizes = np.array([6.0, 3.0, 1.0])
    for psi, printed in itertools.product((np.array([10.0, 4.0]), np.array([5.0, 5.0, 5.0])), (False, True)):
        sol = solve_pmask(list(sizes), list(psi), printed=printed)  # and 3 equal budgets
        m, obj = sol.masks, sol.objective
        w = np.ones(3) if printed else None
        n = len(psi) * 3
        best = min(pmask_objective(c, sizes, psi, w) for bits in range(2 ** n)
                   if ((c := np.array([(bits >> i) & 1 for i in range(n)]).reshape(-1, 3)) @ sizes <= psi).all())
        assert obj == pytest.approx(best)
        assert obj == pytest.approx(pmask_objective(m, sizes, psi, w))


def test_every_run_says_how_good_its_masks_are(tmp_path):
    """summary.json's ``pmask``: a 2-device MLP's P^mask is solved to optimality (gap 0, no note), its objective is
    the run's ``pmask_objective`` and HiGHS's bound does not exceed it; written and read back."""
    import json

    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    cfg = TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": 2, "samples_per_client": 20},
        "model": {"name": "mlp", "args": {"hidden": [6, 4]}},
        "algorithm": {"name": "perfedmask", "args": {"budgets": [1.0, 0.5]}},
        "training": {"rounds": 1, "lr": 0.1},
    })
    res = simulate(cfg)
    p = json.loads((res.write(tmp_path / "run") / "summary.json").read_text())["pmask"]
    assert set(p) == {"status", "objective", "bound", "gap"}  # no "note": the masks are the optimum
    assert p["status"] == "optimal" and p["gap"] == pytest.approx(0.0, abs=1e-9)
    assert p["objective"] == pytest.approx(res.summary["pmask_objective"])
    assert p["bound"] <= p["objective"] + 1e-9


def test_a_solve_stopped_by_its_time_limit_says_its_masks_are_feasible_not_optimal():
    """30 devices × 14 layers in 0.2 s: HiGHS stops at the limit with an incumbent; the masks keep every budget,
    the bound is below the objective and the summary's note says what the masks are."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(100, 10_000, 14).astype(float)
    psi = rng.uniform(0.2, 1.0, 30) * sizes.sum()
    with pytest.warns(RuntimeWarning, match="time limit"):
        sol = solve_pmask(list(sizes), list(psi), time_limit=0.2)
    assert sol.status == "time_limit" and (sol.masks @ sizes <= psi).all()
    assert sol.bound < sol.objective and sol.gap > 0
    assert sol.summary()["note"].startswith("the masking vectors are a feasible, not an optimal, solution of P^mask")
