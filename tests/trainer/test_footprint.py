"""The memory estimate before anything of the run's size exists (trainer.footprint, issues #36 and #44): from the
config and the dataset's sizes, the model on the meta device; per-device state counted in bits where it is bits (by
hand), never less than what the algorithm then holds; the runtime measured; a run that cannot fit refused in one
line before any large allocation."""

import dataclasses
import mmap
import os
import resource
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.footprint import (Footprint, activation_bytes, check_fits, estimate, inference_bytes,
                                        of_shapes, runtime_bytes)
from edgemask.trainer.models import build_model
from edgemask.trainer.simulation import build_algorithm, simulate

EDGEMASK = Path(sys.executable).with_name("edgemask")


def config(algorithm: str, hidden=(16,), clients: int = 4, **args) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0), data=DataConfig(num_clients=clients),
                       model=ModelConfig("mlp", {"hidden": list(hidden)}), algorithm=AlgorithmConfig(algorithm, args),
                       training=TrainingConfig(rounds=2, batch_size=16, lr=10.0))


def test_fedmask_per_device_state_is_its_masks_in_bits_by_hand():
    # MLP 64-16-10: masks fc1 (16×64 = 1024 elements, 128 bytes packed) and out (10×16 = 160, 20 bytes); with
    # prune_last = 2 both are pruned. In the device store, a record each of the structure, m_k and the inference
    # mask: 1 + 2 flag bytes, fc1 at offset 8 (136), out at 136 (156), aligned: 160 bytes; the MLP's batch-norm-free
    # buffers, an empty record of 8 bytes; in RAM while its round lasts, the start's bits, 148.
    fp = estimate(config("fedmask"))
    assert fp.per_device == 3 * 160 + 8 + 148 == 636  # float32 masks would be 4 × 4 × 1184 = 18,944
    assert fp.devices == 4
    algo = build_algorithm(config("fedmask"))
    assert algo.store.bytes_per_device() == 3 * 160 + 8
    assert algo.keep.file_nbytes() == 4 * 148 and algo.keep.nbytes() == 0  # on disk, not on the heap
    one = build_algorithm(config("fedmask", prune_last=1))  # only `out` pruned: its structure alone is stored
    assert one.keep.file_nbytes() == 4 * 20
    # keep: 2 flag bytes, out at offset 8 (28), aligned: 32
    assert estimate(config("fedmask", prune_last=1)).per_device == 2 * 160 + 32 + 8 + 148


def test_the_estimate_bounds_what_a_run_holds_per_device():
    for name in ("fedmask", "standalone", "ditto", "perfedmask"):
        fp = estimate(config(name))
        algo = simulate(config(name)).algorithm
        stored = sum(t.record_bytes * len(t) for t in algo.store.tables.values())
        assert stored > 0, name  # every per-device state in the store, none on the heap besides FedMask's round start
        held = stored + (algo.round_start.nbytes() if name == "fedmask" else 0)
        assert held <= fp.per_device * fp.devices, name
    # Standalone's own model, float32, one record: 1 + 4 flag bytes, fc1.weight at offset 8 (4,096 bytes), fc1.bias
    # at 4,104 (64), out.weight at 4,168 (640), out.bias at 4,808 (40): 4,848 bytes, aligned already
    assert estimate(config("standalone")).per_device == 8 + 4 * (64 * 16 + 16 + 16 * 10 + 10) == 4848
    assert estimate(config("fedavg")).per_device == 0


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_an_algorithm_built_from_shapes_costs_what_the_built_one_does(name):
    """footprint.of_shapes builds the algorithm's model on the meta device: its parameters' bytes and the
    per-device state are the real algorithm's, from shapes alone."""
    cfg = config(name)
    if name in ("fedpews", "fedpews_mlp", "heterofl"):
        cfg = cfg.replace(model=ModelConfig("mlp", {"hidden": [16, 16]}))
    real = build_algorithm(cfg)
    shapes = of_shapes(cfg, (1, 8, 8), 10)
    assert all(v.device.type == "meta" for v in shapes.global_params.values())
    assert shapes.dense_bytes == real.dense_bytes
    assert shapes.client_state_bytes() == real.client_state_bytes(), name


@pytest.mark.parametrize("name, args, shape", [
    ("mlp", {"hidden": [32, 16]}, (1, 8, 8)), ("cnn", {}, (1, 8, 8)), ("vgg16", {"width": 0.0625}, (3, 32, 32)),
    ("resnet18", {"width": 0.125}, (3, 32, 32)), ("tiny_mobilenet", {}, (3, 16, 16)),
    ("char_lstm", {"hidden": 16, "fc": [16]}, (80,))])
def test_the_meta_model_is_the_real_model_in_bytes_and_activations(name, args, shape):
    """The estimate's model term from a meta-device build equals the real model's bytes, and the bytes its
    forward saves equal those a real forward saves (the estimate's former way: a real forward of two samples)."""
    dtype = "int64" if name == "char_lstm" else "float32"
    with torch.device("meta"):
        meta = build_model(name, shape, 10, **args)
    real = build_model(name, shape, 10, **args)
    assert all(p.device.type == "meta" for p in meta.parameters())
    nbytes = lambda m: sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))  # noqa: E731
    assert nbytes(meta) == nbytes(real) > 0
    x = torch.zeros((2, *shape), dtype=getattr(torch, dtype))
    params, saved = {p.data_ptr() for p in real.parameters()}, [0]

    def pack(t):
        if t.data_ptr() not in params:
            saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        real(x)
    assert activation_bytes(meta, shape, dtype) == saved[0] // 2 > 0
    assert 0 < inference_bytes(meta, shape, dtype) <= activation_bytes(meta, shape, dtype) + 4 * x[0].numel() * 2


def test_a_360_gb_model_is_estimated_from_shapes_in_seconds_without_its_memory():
    cfg = config("fedavg", hidden=(300_000, 300_000))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    fp = estimate(cfg)
    assert time.perf_counter() - t0 < 30
    assert fp.model == 6 * 4 * (64 * 300_000 + 300_000 + 300_000 ** 2 + 300_000 + 300_000 * 10 + 10)  # 6 copies
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 200 << 20  # not one of its 360 GB


def test_the_runtime_term_is_measured_not_assumed():
    """The runtime is this process's resident memory (after the run's imports and first uses), not a constant:
    at least what the process holds now, and it follows what the process holds."""
    def rss():
        return int(next(ln for ln in Path("/proc/self/status").read_text().splitlines()
                        if ln.startswith("VmRSS:")).split()[1]) * 1024

    first = runtime_bytes()
    assert first >= rss() and first != 400 << 20
    # 256 MB of new pages, touched: mapped apart from the allocator, which may hold freed pages resident already
    ballast = mmap.mmap(-1, 256 << 20)
    for i in range(0, 256 << 20, mmap.PAGESIZE):
        ballast[i] = 1
    assert runtime_bytes() - first >= 200 << 20
    ballast.close()
    assert estimate(config("fedavg")).runtime >= rss()


def test_a_run_that_cannot_fit_is_refused_naming_what_it_needs_and_what_to_change():
    fp = Footprint(runtime=400 << 20, data=10 << 20, model=60 << 20, per_device=210 << 20, devices=400,
                   phases=(("a round's training", 2 << 30),))
    with pytest.raises(EdgemaskError) as e:
        check_fits(fp, "configs/ic-cifar10-fedmask.toml", available=24 << 30)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("configs/ic-cifar10-fedmask.toml: this run needs about 90.7 GB")
    assert "most of it is the per-device state" in msg and "data.num_clients" in msg and "width" in msg
    check_fits(fp, "x", available=fp.host)  # exactly enough: runs
    small = Footprint(400 << 20, 10 << 20, 60 << 20, 1 << 20, 8, (("the set-up", 6 << 30), ("an evaluation", 1)))
    with pytest.raises(EdgemaskError, match="most of it is the set-up"):
        check_fits(small, "x", available=1 << 30)


LAUNCHER = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[2:]).returncode; "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(rc)")


@pytest.mark.parametrize("what, text, most", [
    ("a 360 GB model", '[model]\nname = "mlp"\n[model.args]\nhidden = [300000, 300000]\n', "a round's training"),
    ("a billion devices", '[data]\nnum_clients = 1000000000\n[algorithm]\nname = "fedmask"\n[training]\n'
                          'rounds = 1\n', "a round's training"),
    ("a billion rounds", '[training]\nrounds = 1000000000\n', "the history"),
])
def test_a_run_that_cannot_fit_is_refused_before_it_allocates(tmp_path, what, text, most):
    """Issue #44: the config whose model is 360 GB ended in the model constructor's 'can't allocate memory'
    traceback before any estimate. Now `edgemask train` estimates from shapes first: exit 2, one line with the
    figures, no traceback, no run directory, in seconds, the process never near the size it refuses."""
    cfg = tmp_path / "big.toml"
    cfg.write_text('[run]\nrun_id = "big"\n' + text)
    out, err = tmp_path / "out", tmp_path / "err"
    t0 = time.perf_counter()
    peak_file = tmp_path / "peak"
    with open(out, "w") as o, open(err, "w") as e:  # through a small launcher: a child forked from this test
        # process would report this process's own peak as its ru_maxrss (Linux keeps the pre-exec high-water mark)
        p = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(peak_file), str(EDGEMASK), "train", "--config",
                              str(cfg), "--workspace", str(tmp_path / "ws")], stdout=o, stderr=e)
    deadline = time.monotonic() + 300
    while (done := os.wait4(p.pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if done[0] == 0:
        p.kill()
        pytest.fail(f"{what}: still running after 300 s")
    seconds, status = time.perf_counter() - t0, os.waitstatus_to_exitcode(done[1])
    peak = int(peak_file.read_text()) * 1024
    stderr = err.read_text()
    assert status == 2, (what, out.read_text(), stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, (what, stderr)
    assert lines[0].startswith(f"edgemask train: error: {cfg}: this run needs about "), lines[0]
    assert "GB of host memory and this host has" in lines[0] and "--no-memory-check" in lines[0]
    assert f"most of it is {most}" in lines[0], lines[0]
    assert not (tmp_path / "ws" / "runs" / "big").exists()
    assert seconds < 120 and peak < 2 << 30, (what, seconds, peak)  # the process never near what it refuses
def test_the_estimate_leaves_the_run_as_it_was():
    """The estimate builds the model on the meta device and lends it to the process's model context only while it
    runs: a run after an estimate is the run without it."""
    cfg = config("fedmask")
    want = simulate(cfg).history
    estimate(cfg)
    assert simulate(cfg).history == want


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


def test_a_part_uploads_before_the_next_part_trains(monkeypatch):
    """FedMask (Algorithm.uploads_alone): a part's results become its uploads as soon as it has trained, so a
    round holds one part's float32 scores, not every device's; the history is the one of uploads made together."""
    from edgemask.trainer import engines, simulation
    from edgemask.trainer.algorithms.fedmask import FedMask

    cfg = config("fedmask", clients=6)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, participation=1.0))
    monkeypatch.setattr(simulation, "TASK_PART_BYTES", 1)  # one task a part
    monkeypatch.setattr(FedMask, "uploads_alone", False)
    want = simulate(cfg).history
    monkeypatch.setattr(FedMask, "uploads_alone", True)
    calls, upload, uploaded, train = [], FedMask.client_updates, [], engines.BatchedEngine.train

    def counted(self, rnd, results):
        calls.append((rnd, len(results)))
        uploaded.extend(weakref.ref(t) for _, res in results for t in res.trained.values())
        return upload(self, rnd, results)

    def trains(self, *args, **kwargs):  # no earlier part's result (its float32 scores) is alive past its upload
        assert [r for r in uploaded if r() is not None] == []
        return train(self, *args, **kwargs)

    monkeypatch.setattr(FedMask, "client_updates", counted)
    monkeypatch.setattr(engines.BatchedEngine, "train", trains)
    assert simulate(cfg).history == want
    rounds = cfg.training.rounds
    assert calls == [(r, 1) for r in range(rounds) for _ in range(6)]  # before: [(r, 6) for r in ...]


def test_perfedmask_with_per_device_budgets_is_estimated_and_trains():
    """The estimate builds the algorithm with no clients: PerFedMask's budgets, one per client, were refused there
    ("3 entries for 0 clients") and stopped every run that set them (issue #44's budgets; found by export's test)."""
    cfg = TrainConfig(data=DataConfig(num_clients=3), model=ModelConfig("mlp", {"hidden": [16, 16]}),
                      algorithm=AlgorithmConfig("perfedmask", {"budgets": [1.0, 0.5, 0.0]}),
                      training=TrainingConfig(rounds=1, batch_size=64))
    assert estimate(cfg).host > 0
    assert simulate(cfg).summary["num_clients"] == 3
