"""Every algorithm keeps its per-device state between rounds in the run's device store (trainer.device_store, issue
#45), not in dicts of every device's tensors on the heap: after a short run the algorithm holds no ``{cid: tensors}``
(a round's own state is emptied with its round), its tables hold the devices that have state (those that trained,
or every device where the set-up, the fine-tuning or the evaluation writes one for all), and the estimate's
``client_state_bytes`` counts at least a device's records."""

from __future__ import annotations

import pytest
import torch

from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.device_store import DeviceTable
from edgemask.trainer.simulation import simulate

CLIENTS = 6
ARGS = {  # short paths through each algorithm's own phases (warmups that cover the round, one fine-tuning epoch)
    "fedpews": {"warmup_rounds": 1}, "fedpews_fixed": {"warmup_rounds": 1},
    "perfedmask": {"finetune_epochs": 1}, "fedbabu": {"finetune_epochs": 1}, "fedrep": {"head_epochs": 1},
    "fedselect": {"p": 0.5, "L": 1, "E": 1, "localalt_epochs": 1}, "lg_fedavg": {"warmup_rounds": 0},
}
# tables with a record for every device, not only those that trained: written by the set-up (FedMask's
# ClientPruning), by every round (Standalone trains everyone), by the fine-tuning or by every evaluation
EVERY_DEVICE = {"fedmask", "standalone", "fedbabu", "perfedmask", "perfedavg"}
STATELESS = {"fedavg", "fedprox", "fednova", "bnn_fedavg", "heterofl"}  # nothing per device (HeteroFL: per rate)


def config(name: str) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0), data=DataConfig(num_clients=CLIENTS),
                       model=ModelConfig("mlp", {"hidden": [16, 16]}),
                       algorithm=AlgorithmConfig(name, ARGS.get(name, {})),
                       training=TrainingConfig(rounds=1, batch_size=16, lr=0.1, participation=0.5))


def holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(map(holds_tensors, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(holds_tensors, value))
    return False


def per_device_dicts(algo) -> list[str]:
    """The algorithm's attributes that are plain dicts keyed by its devices and holding tensors."""
    cids = set(algo.client_ids)
    return [name for name, v in vars(algo).items()
            if isinstance(v, dict) and any(k in cids for k in v) and holds_tensors(v)]


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_per_device_state_lives_in_the_store_not_on_the_heap(name):
    res = simulate(config(name))
    algo = res.algorithm
    assert per_device_dicts(algo) == [], name
    tables = algo.store.tables
    if name in STATELESS:
        assert not tables and algo.client_state_bytes() == 0
        return
    assert tables and all(isinstance(t, DeviceTable) for t in tables.values())
    held = set().union(*map(set, tables.values()))
    if name in EVERY_DEVICE:
        assert held == set(algo.client_ids), name
    else:  # half the devices trained: a record for every device would tell
        trained = {r["client"] for r in res.history if r["metric"] == "train_loss"}
        assert 0 < len(trained) < CLIENTS and held == trained, name
    for t in tables.values():  # every record reads back whole, into fresh tensors of its layout
        for cid in t:
            assert set(t[cid]) <= set(t.fields) and all(v.shape == t.fields[k].shape for k, v in t[cid].items())
    assert 0 < algo.store.bytes_per_device() <= algo.client_state_bytes(), name


def test_a_state_read_back_is_the_one_written_and_reads_do_not_alias():
    """Ditto's personal model round-trips the store bit for bit, and an evaluation's model is the caller's: changing
    it in place changes nothing stored (the next local task starts from what was stored)."""
    algo = simulate(config("ditto")).algorithm
    cid = next(iter(algo.personal))
    model = algo.eval_models([cid])[0]
    stored = {k: v.clone() for k, v in {**model.params, **model.buffers}.items()}
    for v in model.params.values():
        v.add_(1.0)
    assert set(algo.personal[cid]) == set(stored)
    assert all(torch.equal(algo.personal[cid][k], v) for k, v in stored.items())


def test_a_fedmask_evaluation_reads_each_devices_statistics_once(monkeypatch):
    # Both measures (local_mask, returned_mask) use the device's batch-norm statistics: one read of its record for
    # the two, not one each (an evaluation of 400 devices read 800 records and cloned every tensor twice)
    algo = simulate(config("fedmask")).algorithm
    reads, read = [], DeviceTable.read

    def counted(self, cid, names=None, copy=True):
        if self.name == "buffers":
            reads.append(cid)
        return read(self, cid, names, copy)

    monkeypatch.setattr(DeviceTable, "read", counted)
    models = algo.eval_models(list(algo.client_ids))
    assert sorted(reads) == sorted(algo.client_ids)
    assert all(a.buffers is b.buffers for a, b in zip(models["local_mask"], models["returned_mask"]))
