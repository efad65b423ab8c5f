"""Per-device state off the heap (trainer.device_store, issue #45): a record per device at a fixed offset, bools
packed 8 to a byte, fresh tensors on every read, a layout fixed by its first write, a store opened again reading
the same state; FedMask's masks there and not on the heap; ``edgemask train`` keeps the store beside the run and
leaves nothing of it behind."""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.device_store import DeviceStore, record_bytes
from edgemask.trainer.simulation import simulate, train

CIDS = ["a", "b", "c"]
LAYOUT = {"w": ((2, 3), torch.float32), "m": ((13,), torch.bool), "n": ((), torch.int64)}


def test_a_record_is_its_flags_and_aligned_fields_by_hand(tmp_path):
    # flags: 1 + 3 bytes; w at 8 (24 bytes, to 32), m at 32 (13 bools packed: 2 bytes, to 34), n at 40 (8): 48
    assert record_bytes(LAYOUT) == 48
    store = DeviceStore(CIDS, tmp_path)
    t = store.table("t", LAYOUT)
    m = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    t["b"] = {"w": torch.arange(6.0).reshape(2, 3), "m": m, "n": torch.tensor(7)}
    raw = (tmp_path / "t.bin").read_bytes()
    assert len(raw) == 3 * 48  # every device's slot, the file sparse until written
    rec = raw[48:96]  # device "b" is the second
    assert rec[:4] == b"\x01\x01\x01\x01"
    assert np.frombuffer(rec[8:32], dtype=np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    assert rec[32:34] == bytes([0b10110000, 0b11111000])  # big bit order, the last byte zero-padded
    assert np.frombuffer(rec[40:48], dtype=np.int64).tolist() == [7]
    assert raw[:48] == bytes(48) and raw[96:] == bytes(48)  # nothing written for a and c
    header = json.loads((tmp_path / "t.json").read_text())
    assert header["clients"] == CIDS and header["record_bytes"] == 48


def test_reads_are_fresh_tensors_and_absent_fields_stay_absent():
    t = DeviceStore(CIDS).table("t", LAYOUT)  # anonymous temporary files
    t["a"] = {"w": torch.ones(2, 3)}
    got = t["a"]
    assert set(got) == {"w"} and torch.equal(got["w"], torch.ones(2, 3))
    got["w"].zero_()  # a read is the caller's: the stored record is untouched
    assert torch.equal(t["a"]["w"], torch.ones(2, 3))
    assert "a" in t and "b" not in t and list(t) == ["a"] and len(t) == 1
    with pytest.raises(KeyError):
        t["b"]
    assert t.get("b") is None
    t["c"] = {"m": torch.ones(13, dtype=torch.bool), "n": torch.tensor(3)}
    assert t.read("c", ["n"]) == {"n": torch.tensor(3)} and t.read("c", ["w"]) == {}
    del t["a"]
    assert list(t) == ["c"]
    t.clear()
    assert len(t) == 0


def test_a_layout_is_fixed_by_its_first_write():
    t = DeviceStore(CIDS).table("t")
    t["a"] = {"x": torch.zeros(4)}
    with pytest.raises(ValueError, match="'x' is \\(5,\\) torch.float32, the layout has \\(4,\\) torch.float32"):
        t["b"] = {"x": torch.zeros(5)}
    with pytest.raises(ValueError, match="'y' .* no such field"):
        t["b"] = {"y": torch.zeros(4)}
    with pytest.raises(KeyError):
        t["nobody"] = {"x": torch.zeros(4)}


def test_a_store_opened_again_reads_the_same_state(tmp_path):
    # what a resumed run (or another process) sees: the layout from the header, the held records from their flags
    first = DeviceStore(CIDS, tmp_path)
    t = first.table("t", LAYOUT)
    g = torch.Generator().manual_seed(0)
    written = {cid: {"w": torch.randn(2, 3, generator=g), "m": torch.rand(13, generator=g) < 0.5,
                     "n": torch.tensor(i)} for i, cid in enumerate(["a", "c"])}
    for cid, v in written.items():
        t[cid] = v
    first.close()
    again = DeviceStore(CIDS, tmp_path).table("t")
    assert list(again) == ["a", "c"]
    for cid, v in written.items():
        got = again[cid]
        assert all(torch.equal(got[k], v[k]) for k in v)
    with pytest.raises(ValueError, match="another run"):
        DeviceStore(["a", "b"], tmp_path).table("t")


def config(clients=4, **args) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0, run_id="store"), data=DataConfig(num_clients=clients),
                       model=ModelConfig("mlp", {"hidden": [16]}), algorithm=AlgorithmConfig("fedmask", args),
                       training=TrainingConfig(rounds=2, batch_size=16, lr=10.0, participation=0.5))


def test_fedmask_keeps_its_devices_masks_in_the_store_not_on_the_heap():
    algo = simulate(config(clients=6)).algorithm
    assert algo.keep.nbytes() == algo.masks.nbytes() == algo.local.nbytes() == 0  # nothing per device in RAM
    assert len(algo.local.table) == len(algo.masks.table) == len(algo.buffers) == 6
    assert algo.round_start.nbytes() == 0  # a round's start is gone with its round
    reads, writes = algo.store.io()
    assert writes > 0 and reads > 0
    # the bits read back are the masks the device infers with: its stored client state
    cid = algo.client_ids[0]
    packed = algo.local.table[cid]
    state = algo.client_state(cid)
    for w, m in state.masks.items():
        assert torch.equal(torch.from_numpy(np.packbits(m.numpy().astype(np.uint8).reshape(-1))), packed[w])


def test_train_keeps_the_store_beside_the_run_and_removes_it(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    stale = runs / ".store.abcd1234.partial"  # a killed run's store, of this run id
    stale.mkdir()
    (stale / "local.bin").write_bytes(b"x")
    other = runs / ".other.abcd1234.partial"  # another run's: not ours to remove
    other.mkdir()
    seen = []
    real_simulate = simulate

    def spy(cfg, *args, state_dir=None, **kw):
        seen.append(state_dir)
        result = real_simulate(cfg, *args, state_dir=state_dir, **kw)
        seen.append(sorted(p.name for p in state_dir.iterdir()))
        return result

    import edgemask.trainer.simulation as sim
    sim.simulate, saved = spy, sim.simulate
    try:
        path = train(config(), runs)
    finally:
        sim.simulate = saved
    assert seen[0].parent == runs and seen[0].name.startswith(".store.")
    assert "local.bin" in seen[1] and "local.json" in seen[1]
    assert not seen[0].exists() and not stale.exists() and other.exists()
    assert sorted(os.listdir(path)) == sorted(["clients", "config.toml", "digests.json", "history.parquet",
                                               "model.safetensors", "summary.json"])
    assert sorted(p.name for p in runs.iterdir()) == [".other.abcd1234.partial", ".store.lock", "store"]


def test_a_run_through_the_store_writes_what_it_trained(tmp_path):
    # the run directory's client files come from the store's records: equal to the run's own masks
    cfg = config()
    path = train(cfg, tmp_path)
    from edgemask.trainer.run_dir import load_client
    res = simulate(cfg)
    for cid in res.algorithm.client_ids:
        got = load_client(Path(path) / "clients" / f"{cid}.safetensors")
        want = res.algorithm.client_state(cid)
        assert all(torch.equal(got.masks[w], want.masks[w]) for w in want.masks)


def test_a_pinned_device_is_read_from_the_file_once_and_kept_as_written():
    t = DeviceStore(CIDS).table("t", LAYOUT)
    t["a"] = {"w": torch.ones(2, 3)}
    t["b"] = {"w": torch.zeros(2, 3)}
    t.pin(["a"])
    before = t.bytes_read
    for _ in range(3):
        t["a"]
    assert t.bytes_read - before == 48  # one record, once
    t["b"]
    t["b"]
    assert t.bytes_read - before == 3 * 48  # not pinned: each read from the file
    new = torch.full((2, 3), 5.0)
    t["a"] = {"w": new}
    new.zero_()  # the writer's tensor changes; what was written does not
    assert torch.equal(t["a"]["w"], torch.full((2, 3), 5.0)) and t.bytes_read - before == 3 * 48
    t.unpin()
    assert torch.equal(t["a"]["w"], torch.full((2, 3), 5.0)) and t.bytes_read - before == 4 * 48  # the file agrees


def test_a_round_reads_at_most_its_devices_records_and_an_evaluation_each_devices_once():
    import edgemask.trainer.simulation as sim

    cfg = config(clients=8)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, rounds=3, eval_every=10))
    io, real = [], sim.evaluate_clients

    def evaluate_clients(algo, *a, **kw):
        io.append(("eval-start", algo.store.io()))
        out = real(algo, *a, **kw)
        io.append(("eval-end", algo.store.io()))
        return out

    seen = {}
    sim.evaluate_clients = evaluate_clients
    try:
        res = sim.simulate(cfg, ready=lambda algo: seen.setdefault("algo", algo),
                           progress=lambda rnd, total, _: io.append((rnd, seen["algo"].store.io())))
    finally:
        sim.evaluate_clients = real
    record = res.algorithm.store.bytes_per_device()
    marks = dict((k, v) for k, v in io if k in (1, 2, "eval-start", "eval-end"))
    assert marks[2][0] - marks[1][0] <= 4 * record  # round 2: 4 devices (participation 0.5 of 8), once each
    assert marks["eval-end"][0] - marks["eval-start"][0] == 8 * record  # every device's record, once
