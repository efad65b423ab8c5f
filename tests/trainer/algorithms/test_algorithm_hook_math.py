"""The algorithms of issue 4 through their hooks on a tiny model: FedProx's local task, HeteroFL's element-wise
average over holders, FedPeWS-Fixed's masks in the model, PerFedMask's frozen layers."""

from __future__ import annotations

import torch

from edgemask.trainer.algorithms import ALGORITHMS, ClientUpdate
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.task_functions import Fn
from edgemask.trainer.task_program import program


def _algo(name: str, args: dict, hidden=(6, 4), clients: int = 2):
    cfg = TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": 40},
        "model": {"name": "mlp", "args": {"hidden": list(hidden)}},
        "algorithm": {"name": name, "args": args},
        "training": {"rounds": 4, "lr": 0.1},
    })
    algo = ALGORITHMS.get(name)(cfg, build_dataset(cfg.data, cfg.run.seed))
    algo.setup()
    return algo


def test_fedprox_task_gradient_includes_mu_times_distance():
    algo = _algo("fedprox", {"mu": 0.3})
    task = algo.local_task(algo.client_ids[0], 0)
    tr = {k: (v + 0.5).requires_grad_(True) for k, v in task.trainable.items()}  # w − w_g = 0.5 everywhere
    assert task.regularizers == (Fn.of("proximal", mu=0.3),)
    program(task).regularizer(tr, task.constants).backward()
    for k, v in tr.items():
        assert torch.allclose(v.grad, torch.full_like(v, 0.3 * 0.5)), k


def test_heterofl_averages_each_element_over_its_holders():
    algo = _algo("heterofl", {"rates": [1.0, 0.5]})
    a, b = algo.client_ids
    ups = []
    for cid, val in ((a, 2.0), (b, 6.0)):
        payload = {k: torch.full_like(v, val) for k, v in algo.global_params.items()}
        ups.append(ClientUpdate(cid, 10, payload, 0, 0, 0.0))
    g0 = {k: v.clone() for k, v in algo.global_params.items()}
    algo.aggregate(0, ups)
    W = algo.global_params["fc1.weight"]  # (6, 64): client b holds rows 0..2 (⌈0.5·6⌉), all 64 inputs
    assert torch.allclose(W[:3], torch.full((3, 64), 4.0))  # both hold: (2 + 6) / 2
    assert torch.allclose(W[3:], torch.full((3, 64), 2.0))  # only a
    W2 = algo.global_params["fc2.weight"]  # (4, 6): b holds rows 0..1, columns 0..2
    assert torch.allclose(W2[:2, :3], torch.full((2, 3), 4.0))
    assert torch.allclose(W2[:2, 3:], torch.full((2, 3), 2.0)) and torch.allclose(W2[2:], torch.full((2, 6), 2.0))
    assert torch.allclose(algo.global_params["out.weight"][:, :2], torch.full((10, 2), 4.0))
    assert torch.allclose(algo.global_params["fc1.bias"], torch.tensor([4.0, 4, 4, 2, 2, 2]))
    assert not torch.equal(g0["fc1.weight"], W)


def test_fedpews_fixed_masks_cover_hidden_neurons_once():
    algo = _algo("fedpews_fixed", {"warmup_rounds": 2}, hidden=(8, 6), clients=3)
    for layer in ("fc1", "fc2"):
        total = sum(algo.fixed_masks(c)[layer] for c in algo.client_ids)
        assert torch.equal(total, torch.ones_like(total))
    pm = algo.param_masks(algo.fixed_masks(algo.client_ids[0]))
    # client 0 holds neurons 0..2 of fc1 and 0..1 of fc2: fc2's weights between them, the head's columns 0..1
    assert pm["fc2.weight"].sum() == 2 * 3 and pm["out.weight"][:, :2].all() and not pm["out.weight"][:, 2:].any()


def test_perfedmask_frozen_layers_do_not_move():
    algo = _algo("perfedmask", {"budgets": [1.0, 0.5]}, hidden=(8, 8))
    from edgemask.trainer.local_training import local_train
    from edgemask.trainer.sampling import batch_order

    cid = algo.client_ids[1]
    d = algo.dataset.client(cid)
    task = algo.local_task(cid, 0)
    res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, 0, 1), 8)
    for k, v in res.trained.items():
        moved = not torch.equal(v, algo.global_params[k])
        assert moved == bool(algo.keep(cid)[k].any()), k  # exactly the unmasked layers moved (head frozen)
    trained = sum(int(m.sum()) for m in algo.keep(cid).values())  # the elements the client optimizes
    assert trained <= 0.5 * sum(v.numel() for k, v in algo.global_params.items() if not k.startswith("out"))


def test_fedselect_starts_from_a_local_weights_file(tmp_path):
    import pytest
    from safetensors.torch import save_file

    from edgemask.errors import ConfigError

    ref = _algo("fedavg", {})
    state = {k: torch.randn_like(v) for k, v in ref.global_params.items()}
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save({"fc." + k[len("out."):] if k.startswith("out.") else k: v for k, v in state.items()}, tmp_path / "w.pt")
    for f in ("w.safetensors", "w.pt"):  # .pt: read with weights_only=True, torchvision's "fc." mapped to "out."
        algo = _algo("fedselect", {"init_weights": str(tmp_path / f), "L": 1, "E": 1})
        for k, v in state.items():
            assert torch.equal(algo.global_params[k], v), (f, k)
    with pytest.raises(ConfigError, match="not found"):
        _algo("fedselect", {"init_weights": str(tmp_path / "missing.pt")})
