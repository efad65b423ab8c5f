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
