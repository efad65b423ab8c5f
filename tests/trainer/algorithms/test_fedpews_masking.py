"""FedPeWS's masked forward (trainer/algorithms/fedpews.py, ``masked_params``): a dropped neuron contributes nothing
and none of its parameters move, yet the straight-through estimator still gives its score the loss's
sensitivity to it (§4, Eq. 6) — not the zero that masking its incoming weights before the ReLU would give."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.algorithms.fedpews import bernoulli_ste
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset


def _algo():
    cfg = TrainConfig.from_dict({
        "data": {"name": "synthetic", "num_clients": 2, "partition": "natural", "options": {"size": "3.2k"}},
        "model": {"name": "fedpews_mlp", "args": {"hidden": [8, 6]}},
        "algorithm": {"name": "fedpews", "args": {"warmup_rounds": 1, "lambda_div": 0.0}},
        "training": {"rounds": 2, "lr": 0.1, "batch_size": 8},
    })
    algo = ALGORITHMS.get("fedpews")(cfg, build_dataset(cfg.data, cfg.run.seed))
    algo.setup()
    return algo


def test_dropped_neuron_is_silent_frozen_and_still_scored():
    algo = _algo()
    d = algo.dataset.client(algo.client_ids[0])
    x, y = d.train_x[:32], d.train_y[:32]
    keep = {"fc1": torch.ones(8), "fc2": torch.ones(6)}
    keep["fc1"][3] = 0.0  # neuron 3 of the first hidden layer dropped
    params = {k: v.clone().requires_grad_(True) for k, v in algo.global_params.items()}
    theta = {n: torch.full_like(m, 0.5).requires_grad_(True) for n, m in keep.items()}
    # the STE's value is the sample (here: ``keep``); its gradient goes to θ as if it were the identity
    mask = {n: keep[n] + theta[n] - theta[n].detach() for n in keep}
    out = algo.model_context.call(algo.masked_params(params, mask), {}, x)
    # the same as the model with the neuron's incoming weights and bias zeroed: it contributes nothing
    ref = {k: v.detach().clone() for k, v in algo.global_params.items()}
    ref["fc1.weight"][3] = 0.0
    ref["fc1.bias"][3] = 0.0
    torch.testing.assert_close(out, algo.model_context.call(ref, {}, x))
    F.cross_entropy(out, y).backward()
    # none of the dropped neuron's parameters get a gradient (Alg. 1 line 17 trains only the subnetwork) ...
    assert not params["fc1.weight"].grad[3].any() and not params["fc1.bias"].grad[3].any()
    assert not params["fc2.weight"].grad[:, 3].any()
    assert params["fc1.weight"].grad[2].any()
    # ... but its score does: the loss's sensitivity to switching it on (Procedure I can bring it back)
    assert theta["fc1"].grad[3] != 0


def test_bernoulli_ste_value_is_binary():
    theta = torch.full((1000,), 0.3)
    m = bernoulli_ste(theta)
    assert set(m.unique().tolist()) <= {0.0, 1.0}
