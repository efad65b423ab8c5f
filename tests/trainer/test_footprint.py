"""The memory estimate before set-up (trainer.footprint, issue #36): per-device state counted in bits where it is
bits (by hand), never less than what the algorithm then holds, and a run that cannot fit refused in one line."""

import dataclasses

import pytest
import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.footprint import Footprint, check_fits, estimate
from edgemask.trainer.simulation import build_algorithm, simulate


def config(algorithm: str, hidden=(16,), clients: int = 4, **args) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0), data=DataConfig(num_clients=clients),
                       model=ModelConfig("mlp", {"hidden": list(hidden)}), algorithm=AlgorithmConfig(algorithm, args),
                       training=TrainingConfig(rounds=2, batch_size=16, lr=10.0))


def test_fedmask_per_device_state_is_its_masks_in_bits_by_hand():
    # MLP 64-16-10: masks fc1 (16×64 = 1024 elements, 128 bytes packed) and out (10×16 = 160, 20 bytes); with
    # prune_last = 2 both are pruned: m_k, the inference mask, a round's start and the structure, 4 × 148 bytes.
    seen = {}
    algo = build_algorithm(config("fedmask"), before_setup=lambda a: seen.setdefault("fp", estimate(a)))
    assert seen["fp"].per_device == 4 * (128 + 20) == 592  # float32 masks would be 4 × 4 × 1184 = 18,944
    assert seen["fp"].devices == 4
    held = algo.keep.nbytes() + algo.local.nbytes() + algo.round_start.nbytes()  # m_k shares local's bytes at first
    assert held <= 4 * 592 and algo.keep.nbytes() == 4 * 148
    one = build_algorithm(config("fedmask", prune_last=1))  # only `out` pruned: its structure alone is stored
    assert one.keep.nbytes() == 4 * 20 and estimate(one).per_device == 3 * 148 + 20


def test_the_estimate_bounds_what_a_run_holds_per_device():
    for name in ("fedmask", "standalone", "ditto", "perfedmask"):
        res = simulate(config(name))
        algo = res.algorithm
        fp = estimate(algo)
        if name == "fedmask":
            held = algo.masks.nbytes() + algo.keep.nbytes() + algo.round_start.nbytes()
        else:
            held = sum(v.nbytes for cid in algo.client_ids for v in algo.client_state(cid).params.values())
        assert held <= fp.per_device * fp.devices, name
    standalone = estimate(build_algorithm(config("standalone")))
    assert standalone.per_device == 4 * (64 * 16 + 16 + 16 * 10 + 10)  # its own model, float32
    assert estimate(build_algorithm(config("fedavg"))).per_device == 0


def test_a_run_that_cannot_fit_is_refused_naming_what_it_needs_and_what_to_change():
    fp = Footprint(runtime=400 << 20, data=10 << 20, model=60 << 20, per_device=210 << 20, devices=400,
                   engine=2 << 30, device="cpu")
    with pytest.raises(EdgemaskError) as e:
        check_fits(fp, "configs/ic-cifar10-fedmask.toml", available=24 << 30)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("configs/ic-cifar10-fedmask.toml: this run needs about 90.7 GB")
    assert "most of it is the per-device state" in msg and "data.num_clients" in msg and "width" in msg
    check_fits(fp, "x", available=fp.host)  # exactly enough: runs
    small = Footprint(400 << 20, 10 << 20, 60 << 20, 1 << 20, 8, 6 << 30, "cpu")
    with pytest.raises(EdgemaskError, match="most of it is the stacked training"):
        check_fits(small, "x", available=1 << 30)


def test_the_estimate_leaves_the_run_as_it_was():
    """The activation probe runs the model forward once: batch norm's statistics are put back, so a run with the
    estimate is the run without it."""
    cfg = config("fedmask")
    want = simulate(cfg).history
    assert simulate(cfg, before_setup=estimate).history == want


def test_client_pruning_in_chunks_gives_the_masks_of_one_call(monkeypatch):
    """ClientPruning trains the devices a chunk at a time (PRUNING_CHUNK_BYTES of scores); each device's orders,
    top-k and bits must be its own whatever the chunk, so 1-device chunks give the masks of one call."""
    from edgemask.trainer.algorithms import fedmask

    cfg = config("fedmask", clients=6)
    whole = build_algorithm(cfg)
    monkeypatch.setattr(fedmask, "PRUNING_CHUNK_BYTES", 1)  # one device a call
    assert whole._pruning_chunks(whole.local.shapes) != [whole.client_ids]
    chunked = build_algorithm(cfg)
    for cid in whole.client_ids:
        for store in ("masks", "keep", "local"):
            a, b = getattr(whole, store).packed(cid), getattr(chunked, store).packed(cid)
            assert a.keys() == b.keys() and all(torch.equal(a[w], b[w]) for w in a), (cid, store)
    assert len({bytes(whole.masks.packed(c)["fc1.weight"].tolist()) for c in whole.client_ids}) > 1  # personalized


def test_a_round_built_in_parts_is_the_round_built_whole(monkeypatch):
    """train_clients cuts a round's tasks into parts of TASK_PART_BYTES (built as reached): the history is the
    same as with the whole round built first."""
    from edgemask.trainer import simulation

    cfg = config("fedmask", clients=6)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, participation=1.0))
    want = simulate(cfg).history
    monkeypatch.setattr(simulation, "TASK_PART_BYTES", 1)  # one task a part
    assert simulate(cfg).history == want
