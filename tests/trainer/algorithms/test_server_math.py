"""Hand-computed server updates and mask math of PerFedMask, FedPeWS, FedSelect, FedProx and HeteroFL."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from edgemask.trainer.aggregation import mask_weighted_average
from edgemask.trainer.algorithms.fedpews import bernoulli_ste, fixed_partition, server_update
from edgemask.trainer.algorithms.fedselect import shared_average, top_candidates
from edgemask.trainer.algorithms.perfedmask import pmask_objective, solve_pmask
from edgemask.trainer.losses import proximal_term


# -- PerFedMask -------------------------------------------------------------------------------------------
def test_perfedmask_kn_weighting_by_hand():
    g = torch.tensor([9.0, 9.0, 9.0, 9.0])
    w = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([5.0, 6.0, 7.0, 8.0]), torch.tensor([0.0, 10.0, 20.0, 30.0])]
    m = [torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])]
    # element 0: k = 1/3 each; 1: only device 0; 2: only device 1; 3: nobody -> keeps w_g
    expect = torch.tensor([(1 + 5 + 0) / 3, 2.0, 7.0, 9.0])
    assert torch.allclose(mask_weighted_average(g, w, m), expect)


def _brute_force(sizes, psi):
    """The optimal value of P^mask and every (N, J) choice attaining it, by enumerating all 2^(N·J) choices."""
    s, p = np.array(sizes, float), np.array(psi, float)
    scored = []
    for bits in itertools.product([0, 1], repeat=len(sizes) * len(psi)):
        m = np.array(bits).reshape(len(psi), len(sizes))
        if np.all(m @ s <= p):  # ε_n ≥ 0
            scored.append((pmask_objective(m, s, p), bits))
    best = min(o for o, _ in scored)
    return best, {b for o, b in scored if o == pytest.approx(best)}


@pytest.mark.parametrize("sizes,psi", [([3, 5, 2, 4], [14, 7, 5]), ([4, 1, 6], [11, 6, 2]), ([2, 2, 3], [7, 7, 3]),
                                       ([1, 1, 1, 8], [8, 3]),
                                       # equal budgets (interchangeable devices)
                                       ([3, 1, 2], [3, 3, 3, 6]), ([2, 5, 1, 3], [6, 6, 11, 11]),
                                       ([4, 4, 1], [5, 5, 5]), ([1, 2, 3, 4], [5, 5, 10])])
def test_pmask_milp_equals_brute_force(sizes, psi):
    sol = solve_pmask(sizes, psi)
    m, obj = sol.masks, sol.objective
    best, argmins = _brute_force(sizes, psi)
    assert obj == pytest.approx(best)
    assert tuple(m.ravel().tolist()) in argmins  # the chosen vectors themselves are optimal
    assert np.all(m @ np.array(sizes) <= np.array(psi))  # the budgets hold
    assert set(np.unique(m)) <= {0, 1}


def test_pmask_weighs_a_layer_by_its_parameter_count():
    # Layers of 1, 1 and 4 parameters (d_w = 6), budgets ψ = (4, 2). Counting layers (Σ_j m̃_nj) picked the two
    # small layers on both devices and never trained the 4-parameter one. Weighted by |π_j| (the poster's bound):
    # device 0 trains the big layer alone: 6·1 − 4·1 + 0 = 2, device 1 nothing: 0 − 0 + 2 = 2, total 4; the
    # two-small-layers choice costs (6·½ − 1 + 2) + (6·½ − 1 + 0) = 6. Brute force: the only optimum.
    sol = solve_pmask([1, 1, 4], [4, 2])
    m, obj = sol.masks, sol.objective
    assert m.tolist() == [[0, 0, 1], [0, 0, 0]]
    assert obj == pytest.approx(4.0)
    assert _brute_force([1, 1, 4], [4, 2]) == (pytest.approx(4.0), {(0, 0, 1, 0, 0, 0)})
    assert pmask_objective(np.array([[1, 1, 0], [1, 1, 0]]), np.array([1.0, 1, 4]), np.array([4.0, 2])) == 6.0


def test_pmask_past_its_time_limit_uses_the_incumbent_and_warns(monkeypatch):
    # HiGHS at its time limit: status 1, success False, x = the best feasible point found. A fake of milp (the
    # real one's answer relabelled) stands for a solve too large to run out the clock in a test.
    import scipy.optimize

    real = scipy.optimize.milp

    def timed_out(*args, **kwargs):
        res = real(*args, **kwargs)
        res.status, res.success, res.message = 1, False, "Time limit reached."
        # HiGHS's bound on its cost, Σ_n (d_w γ_n + ε_n)/d_w + Σ_j |π_j| z_j0/d_w: 1.5 is P^mask's 1.5·6 − 6 = 3
        res.mip_dual_bound = 1.5
        return res

    monkeypatch.setattr(scipy.optimize, "milp", timed_out)
    with pytest.warns(RuntimeWarning, match="time limit .* gap of 25.0%"):
        sol = solve_pmask([1, 1, 4], [4, 2], time_limit=5)
        m, obj = sol.masks, sol.objective
    assert m.tolist() == [[0, 0, 1], [0, 0, 0]] and obj == pytest.approx(4.0)
    assert (sol.status, sol.bound, sol.gap) == ("time_limit", pytest.approx(3.0), pytest.approx(0.25))  # (4 − 3)/4
    entry = sol.summary()
    assert entry["status"] == "time_limit" and "a feasible, not an optimal, solution" in entry["note"]
    monkeypatch.undo()
    assert solve_pmask([1, 1, 4], [4, 2]).summary() == {"status": "optimal", "objective": pytest.approx(4.0),
                                                         "bound": pytest.approx(4.0), "gap": 0.0}


def test_pmask_objective_by_hand():
    # two devices, layers of 2 and 3 params; device 0 trains both, device 1 the second: k̃ = [[1, 1/2], [0, 1/2]]
    m = np.array([[1, 1], [0, 1]])
    # d_w = 5: device 0: 5·1 − (2·1 + 3·½) + (5 − 5) = 1.5; device 1: 5·½ − 3·½ + (4 − 3) = 2
    assert pmask_objective(m, np.array([2.0, 3.0]), np.array([5.0, 4.0])) == pytest.approx(3.5)


# -- FedPeWS ----------------------------------------------------------------------------------------------
def test_fedpews_server_update_by_hand():
    xg = torch.tensor([1.0, 1.0, 1.0, 1.0])
    xs = [torch.tensor([3.0, 5.0, 7.0, 2.0]), torch.tensor([5.0, 9.0, 11.0, 4.0])]
    ms = [torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])]
    # Σ x⊙m / Σ m = [4, 9, 7, (none: x_g = 1)];  x_g − 0.5 (x_g − avg)
    assert torch.allclose(server_update(xg, xs, ms, 0.5), torch.tensor([2.5, 5.0, 4.0, 1.0]))
    assert torch.allclose(server_update(xg, xs, ms, 1.0), torch.tensor([4.0, 9.0, 7.0, 1.0]))
    # None: a client that trained everything (m = 1), the same bits as with an explicit all-ones mask
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(50, generator=g) for _ in range(7)]
    ms = [None if i % 3 else (torch.rand(50, generator=g) < 0.5).float() for i in range(7)]
    explicit = [torch.ones(50) if m is None else m for m in ms]
    x0 = torch.randn(50, generator=g)
    assert torch.equal(server_update(x0, xs, ms, 0.7), server_update(x0, xs, explicit, 0.7))


def test_ste_passes_gradient_through_bernoulli_sample():
    torch.manual_seed(0)
    s = torch.tensor([0.3, -1.0, 2.0], requires_grad=True)
    w = torch.tensor([1.0, 2.0, -3.0])
    theta = torch.sigmoid(s)
    m = bernoulli_ste(theta)
    assert set(m.detach().tolist()) <= {0.0, 1.0}  # the forward value is a binary sample
    (m * w).sum().backward()
    expect = w * theta.detach() * (1 - theta.detach())  # ∂m/∂θ = 1, then the sigmoid
    assert s.grad is not None and torch.allclose(s.grad, expect)
    assert torch.all(s.grad != 0)


@pytest.mark.parametrize("units,parts", [(32, 4), (7, 3), (5, 5)])
def test_fedpews_fixed_partition_is_disjoint_and_covering(units, parts):
    ms = torch.stack(fixed_partition(units, parts))
    assert torch.equal(ms.sum(0), torch.ones(units))  # covering, and no neuron in two subnetworks
    assert torch.all(ms.sum(1) >= 1)


# -- FedSelect --------------------------------------------------------------------------------------------
def test_fedselect_shared_only_average_by_hand():
    g = torch.tensor([0.0, 0.0, 0.0])
    vals = [torch.tensor([2.0, 4.0, 6.0]), torch.tensor([8.0, 10.0, 12.0])]
    personal = [torch.tensor([False, True, True]), torch.tensor([False, False, True])]
    # pos 0 shared by both, weights 1 and 3: (2 + 3·8)/4 = 6.5; pos 1 only client 1: 10; pos 2 nobody: keep 0
    out = shared_average(g, vals, personal, [1.0, 3.0])
    assert torch.allclose(out, torch.tensor([6.5, 10.0, 0.0]))


def test_gradltn_keeps_exactly_the_largest_fraction_of_candidates():
    gamma = {"a": torch.tensor([[5.0, 1.0], [9.0, 3.0]]), "b": torch.tensor([7.0, 2.0, 8.0, 4.0])}
    cand = {"a": torch.tensor([[True, True], [False, True]]), "b": torch.tensor([True, True, False, True])}
    # candidates' γ: a: 5, 1, 3; b: 7, 2, 4 (9 and 8 are not candidates); keep 0.5·6 = 3 largest: 7, 5, 4
    keep = top_candidates(gamma, cand, 0.5)
    assert torch.equal(keep["a"], torch.tensor([[True, False], [False, False]]))
    assert torch.equal(keep["b"], torch.tensor([True, False, False, True]))
    assert sum(int(v.sum()) for v in keep.values()) == 3


def test_gradltn_of_many_clients_at_once_is_each_clients_own():
    from edgemask.trainer.algorithms.fedselect import top_candidates_many

    torch.manual_seed(0)
    K = 5
    gamma = {"a": torch.rand(K, 6, 4), "b": torch.rand(K, 9)}
    gamma["a"][:, :2] = 0.0  # exact ties (parameters that did not move)
    cand = {"a": torch.rand(K, 6, 4) < 0.7, "b": torch.rand(K, 9) < 0.7}  # unequal candidate counts per client
    together = top_candidates_many(gamma, cand, 0.5)
    for i in range(K):
        alone = top_candidates({n: g[i] for n, g in gamma.items()}, {n: c[i] for n, c in cand.items()}, 0.5)
        assert all(torch.equal(together[n][i], alone[n]) for n in gamma), i
        n_cand = sum(int(c[i].sum()) for c in cand.values())
        assert sum(int(together[n][i].sum()) for n in gamma) == max(1, round(0.5 * n_cand))
        assert all(not (together[n][i] & ~cand[n][i]).any() for n in gamma)  # only candidates are kept


# -- FedProx ----------------------------------------------------------------------------------------------
def test_fedprox_gradient_includes_mu_times_distance():
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    wg = torch.tensor([0.5, 0.0, 4.0])
    reg = proximal_term(0.2)({"w": w}, {"g:w": wg})
    assert float(reg.detach()) == pytest.approx(0.1 * (0.25 + 4 + 1))
    reg.backward()
    assert torch.allclose(w.grad, 0.2 * (w.detach() - wg))


# -- rounds to a target accuracy (FedPeWS Table 2) --------------------------------------------------------
def test_rounds_to_target_counts_from_one_on_the_global_accuracy():
    from edgemask.trainer.simulation import global_summary

    hist = [{"round": r, "client": "server", "metric": "global_accuracy", "value": v}
            for r, v in enumerate([0.3, 0.6, 0.95, 0.8, 0.99])]
    hist.append({"round": 0, "client": "client-000", "metric": "accuracy", "value": 1.0})  # not the global model
    assert global_summary(hist, 0.9) == {"global_accuracy": 0.99, "target_accuracy": 0.9, "rounds_to_target": 3}
    assert global_summary(hist, 0.999)["rounds_to_target"] is None
