"""The run directory contract: written, reloaded, and refused cleanly when damaged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgemask.errors import ConfigError, CorruptFileError, EdgemaskError
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, TrainConfig, TrainingConfig
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.run_dir import ClientState, load_client, load_run, save_client, write_digests, write_run
from edgemask.trainer.simulation import simulate


def small_config(algo: str, **args) -> TrainConfig:
    lr = 100.0 if algo == "fedmask" else 0.05
    return TrainConfig(
        data=DataConfig(num_clients=4), model=ModelConfig("mlp", {"hidden": [32, 16]}),
        algorithm=AlgorithmConfig(algo, args),
        training=TrainingConfig(rounds=2, local_epochs=1, batch_size=32, lr=lr, momentum=0.9),
    )


@pytest.fixture(scope="module", params=["fedavg", "fedmask"])
def written_run(request, tmp_path_factory):
    res = simulate(small_config(request.param))
    path = res.write(tmp_path_factory.mktemp("runs") / res.config.run_id)
    return res, path


def test_run_directory_has_the_contract_files(written_run):
    res, path = written_run
    for f in ("config.toml", "model.safetensors", "history.parquet", "summary.json"):
        assert (path / f).is_file(), f
    assert sorted(p.stem for p in (path / "clients").glob("*.safetensors")) == res.algorithm.client_ids
    hist = load_run(path).history()
    assert list(hist.columns) == ["round", "client", "metric", "value"]
    assert {"accuracy", "bytes_up", "bytes_down", "flops_fwd", "flops_bwd"} <= set(hist["metric"])
    assert not list(path.parent.glob(".*partial"))


def test_reloaded_client_models_reproduce_the_recorded_accuracy(written_run):
    res, path = written_run
    run = load_run(path)
    assert run.config.to_dict() == res.config.to_dict()  # config.toml round-trips every field, seed included
    summary = json.loads((path / "summary.json").read_text())
    for cid in run.client_ids:
        model = run.build_model(cid)
        d = run.dataset.client(cid)
        acc, _ = evaluate(model, d.test_x, d.test_y)
        assert acc == pytest.approx(summary["clients"][cid]["accuracy"], abs=1e-9), cid


def test_fedmask_client_files_hold_packed_binary_masks(written_run):
    res, path = written_run
    from safetensors.numpy import load_file

    arrays = load_file(str(path / "clients" / "client-000.safetensors"))
    if res.config.algorithm.name == "fedavg":  # FedAvg's clients are the global model: nothing personal
        assert not any(k.startswith("mask.") for k in arrays)
        return
    # 64·32 + 32·16 + 16·10 mask elements, 1 bit each, packed per layer: ⌈n/8⌉ bytes
    assert arrays["mask.fc1.weight"].nbytes == (64 * 32 + 7) // 8
    assert arrays["mask.fc2.weight"].nbytes == (32 * 16 + 7) // 8
    assert arrays["mask.out.weight"].nbytes == (16 * 10 + 7) // 8


def test_client_state_round_trip(tmp_path):
    masks = {"a.weight": (torch.rand(5, 7) > 0.5).float(), "b.weight": torch.zeros(3, 3, 3, 3)}
    params = {"bn.running_mean": torch.randn(4)}
    save_client(tmp_path / "c.safetensors", ClientState(masks, params))
    back = load_client(tmp_path / "c.safetensors")
    assert set(back.masks) == set(masks)
    for k in masks:
        assert torch.equal(back.masks[k], masks[k])
    assert torch.equal(back.params["bn.running_mean"], params["bn.running_mean"])


def test_missing_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(EdgemaskError, match="not found"):
        load_run(tmp_path / "nope")


def test_truncated_checkpoint_is_a_corrupt_file_error(written_run, tmp_path):
    import shutil

    _, path = written_run
    copy = tmp_path / "run"
    shutil.copytree(path, copy)
    ck = copy / "model.safetensors"
    ck.write_bytes(ck.read_bytes()[:100])
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        load_run(copy).build_model(None)


def test_mask_that_does_not_fit_the_model_is_refused(written_run, tmp_path):
    import shutil

    _, path = written_run
    copy = tmp_path / "run"
    shutil.copytree(path, copy)
    save_client(copy / "clients" / "client-000.safetensors",
                ClientState({"fc1.weight": torch.ones(3, 3)}, {}))
    write_digests(copy)  # vouch for the changed file: the check under test is the one behind the digests
    with pytest.raises(CorruptFileError, match="does not fit"):
        load_run(copy).build_model("client-000")


def _strip_metadata(path) -> None:
    """Rewrite a client file with the same tensors and no metadata (what a hand-made or foreign file looks like)."""
    from safetensors.numpy import load_file, save_file

    save_file(load_file(str(path)), str(path))


def test_client_file_without_its_mask_metadata_is_refused_not_read_as_dense(written_run, tmp_path):
    import shutil

    res, path = written_run
    copy = tmp_path / "run"
    shutil.copytree(path, copy)
    f = copy / "clients" / "client-000.safetensors"
    _strip_metadata(f)
    write_digests(copy)  # as if a tool had re-recorded the digests: the metadata check still holds
    # read without its masks, FedMask's client-000 would be the dense model; FedAvg's (no masks) likewise unproven
    with pytest.raises(CorruptFileError) as e:
        load_run(copy).build_model("client-000")
    assert str(e.value).startswith(f"{f}: no 'mask_shapes' metadata") and "\n" not in str(e.value)
    load_run(copy).build_model("client-001")  # the other clients still load


def test_client_file_with_undescribed_tensors_is_refused(tmp_path):
    from safetensors.numpy import save_file

    f = tmp_path / "c.safetensors"
    save_file({"fc1.weight": np.ones((3, 3), np.float32)}, str(f), metadata={"mask_shapes": "{}"})
    with pytest.raises(CorruptFileError, match="tensor 'fc1.weight' is neither a recorded mask"):
        load_client(f)


def _write(path, run=None):
    res = run or simulate(small_config("fedavg").replace(training=TrainingConfig(rounds=0, batch_size=64)))
    return res, write_run(path, res.config, res.algorithm.shared_state(),
                          {c: res.algorithm.client_state(c) for c in res.algorithm.client_ids}, [], res.summary)


def test_write_run_never_removes_what_is_not_a_run(tmp_path):
    foreign = tmp_path / "runs" / "mine"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(EdgemaskError, match="exists and is not an edgemask run directory; edgemask replaces only"):
        _write(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in foreign.parent.iterdir()) == ["mine"]  # no temporary left beside it
    with pytest.raises(ConfigError, match="run id of"):
        _write(tmp_path / "runs" / "..")


def test_write_run_replaces_a_run_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "runs" / "r"
    res, _ = _write(path)
    (path / "clients" / "client-009.safetensors").write_bytes(b"stale")  # not in the new run: must go
    _write(path, res)
    assert sorted(p.name for p in (path / "clients").iterdir()) == [f"client-00{i}.safetensors" for i in range(4)]
    assert sorted(p.name for p in path.parent.iterdir()) == ["r"]


def test_run_lock_refuses_a_second_writer_and_clears_a_killed_ones_temporaries(tmp_path):
    from edgemask.trainer.run_dir import run_lock

    path = tmp_path / "runs" / "r"
    path.parent.mkdir(parents=True)
    stale = path.parent / ".r.abcd_123.partial"  # the pattern atomic_dir makes: a killed writer's leftovers
    other = path.parent / ".r.b.abcd_123.partial"  # run "r.b"'s temporary: not ours to remove
    for d in (stale, other):
        d.mkdir()
    with run_lock(path):
        assert not stale.exists() and other.exists()
        with pytest.raises(EdgemaskError, match=r"run r is in use by another edgemask process \(lock .*\.r\.lock\)"):
            with run_lock(path):
                pass


def test_a_writer_killed_between_its_renames_loses_no_run(tmp_path):
    """atomic_dir renames the old run aside, then the new one in: a kill between the two leaves the old run as
    ``.r.<random>.old`` and no ``r``. The next writer, under the lock, renames it back instead of removing it."""
    from edgemask.trainer.run_dir import run_lock

    path = tmp_path / "runs" / "r"
    _write(path)
    before = sorted(p.name for p in path.rglob("*"))
    aside = path.parent / ".r.k1ll3d_x.old"
    path.rename(aside)
    (path.parent / ".r.k1ll3d_x.partial").mkdir()  # the new run, half written
    with run_lock(path):
        assert sorted(p.name for p in path.rglob("*")) == before
    assert sorted(p.name for p in path.parent.iterdir()) == [".r.lock", "r"]
