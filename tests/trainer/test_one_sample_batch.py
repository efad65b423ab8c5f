"""``training.one_sample_batch``: an epoch's last minibatch of one sample in a model whose batch norm then sees one
value per channel (VGG16 on FEMNIST's 28×28: conv11–13 are 1×1), which torch refuses to train on."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from edgemask.errors import ConfigError
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.flower import loopback_phases
from edgemask.trainer.models.registry import MODELS, one_value_norms
from edgemask.trainer.sampling import drop_one_sample_batches, epoch_samples, epoch_steps
from edgemask.trainer.simulation import simulate


def test_drop_leaves_out_only_a_last_sample_that_would_be_alone():
    a, b, c = np.arange(17), np.arange(16), np.arange(33)[::-1].copy()
    out = drop_one_sample_batches([[a, b], [c], [np.arange(1)]], 16)
    assert out[0][0].tolist() == list(range(16))  # 17 = 16 + 1: the permutation's last goes
    assert out[0][1] is b  # 16: nothing to drop, the same array
    assert out[1][0].tolist() == list(range(32, 0, -1))  # 33 = 2·16 + 1: sample 0 (last in this order) goes
    assert len(out[2][0]) == 0  # a device of one sample: nothing left to train on
    assert len(drop_one_sample_batches([[a]], 8)[0][0]) == 16  # 17 = 2·8 + 1: dropped at 8 too
    assert len(drop_one_sample_batches([[np.arange(18)]], 8)[0][0]) == 18  # 18 = 2·8 + 2: kept


def test_epoch_steps_count_what_drop_leaves_to_train():
    assert (epoch_samples(17, 16, True), epoch_steps(17, 16, True)) == (16, 1)  # 17 = 16 + 1: one step, not 2
    assert (epoch_samples(17, 16, False), epoch_steps(17, 16, False)) == (17, 2)
    assert (epoch_samples(33, 16, True), epoch_steps(33, 16, True)) == (32, 2)
    assert (epoch_samples(18, 16, True), epoch_steps(18, 16, True)) == (18, 2)  # 18 = 16 + 2: nothing dropped
    assert (epoch_samples(1, 16, True), epoch_steps(1, 16, True)) == (0, 0)
    assert epoch_steps(5, 1, True) == 5  # batch size 1: no epoch ends in a lone extra sample
    for n in range(1, 40):  # the count is that of the orders drop_one_sample_batches leaves
        order = drop_one_sample_batches([[np.arange(n)]], 8)[0][0]
        assert epoch_samples(n, 8, True) == len(order) and epoch_steps(n, 8, True) == -(-len(order) // 8)


def test_a_system_round_counts_the_steps_the_device_trained():
    """A [system] round of a device with 17 samples at B = 16 under drop: 16 samples an epoch, one step each. With
    17 epochs the 272 samples seen are a whole multiple of 17 too, which ⌈17 / 16⌉ · 16 = 32 steps misread."""
    from edgemask.trainer.system import System, SystemConfig

    cfg = SystemConfig.read("test", {"deadline_s": 100.0, "boards": {"b": {"share": 1.0, "step_ms": 10.0}}})
    drop = System(cfg, {"d": "b"}, batch_size=16, k=1, drop_one_sample=True)
    assert drop.device_round("d", 17, 17 * 16, 1.0, 0, 0).steps == 17
    assert drop.device_round("d", 17, 2 * 16, 1.0, 0, 0).steps == 2
    keep = System(cfg, {"d": "b"}, batch_size=16, k=1)
    assert keep.device_round("d", 17, 2 * 17, 1.0, 0, 0).steps == 4


def test_one_value_norms_finds_the_1x1_batch_norms_by_shape():
    assert one_value_norms("vgg16", (1, 28, 28), 62, {"width": 1 / 16}) == ("bn11", "bn12", "bn13")
    assert one_value_norms("vgg16", (3, 32, 32), 10, {"width": 1 / 16}) == ()  # 2×2 there: 4 values
    assert one_value_norms("mlp", (64,), 10, {}) == ()  # no batch norm


def test_one_value_norms_counts_a_batchnorm1d_on_features(monkeypatch):
    def bn1d(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 8), nn.BatchNorm1d(8),
                             nn.Linear(8, num_classes))
    monkeypatch.setitem(MODELS._entries, "test_bn1d_mlp", bn1d)
    assert one_value_norms("test_bn1d_mlp", (4,), 3) == ("2",)  # (1, 8): one value per channel


def _femnist(root, counts):
    """LEAF FEMNIST JSON: writer i with counts[i] train samples (labels cycling), 2 test samples."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        users = {f"f_{i:04d}": (n if split == "train" else 2) for i, n in enumerate(counts)}
        doc = {"users": list(users), "num_samples": list(users.values()),
               "user_data": {u: {"x": rng.random((n, 784)).round(3).tolist(), "y": [j % 62 for j in range(n)]}
                             for u, n in users.items()}}
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"all_data_0_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return root


def _cfg(root, rule="auto", batched=True, batch_size=16, model="vgg16", args=None):
    return TrainConfig.from_dict({
        "data": {"name": "femnist", "root": str(root), "num_clients": 2, "partition": "natural"},
        "model": {"name": model, "args": {"width": 1 / 16} if args is None else args},
        "algorithm": {"name": "fedavg", "args": {}},
        "training": {"rounds": 1, "local_epochs": 2, "batch_size": batch_size, "lr": 0.01, "batched": batched,
                     "one_sample_batch": rule}})


def _seen(res):
    return {r["client"]: r["value"] for r in res.history if r["metric"] == "samples_seen"}


@pytest.mark.parametrize("batched", [True, False])
def test_auto_drops_the_lone_sample_for_vgg16_on_28x28_and_both_engines_agree(tmp_path, batched):
    root = _femnist(tmp_path, [17, 5])  # writer 0's epoch ends in a minibatch of one
    torch.manual_seed(0)
    res = simulate(_cfg(root, batched=batched))
    # 2 epochs of 16 (17 less the lone sample) and 2 of 5 (5 ≡ 5 mod 16: kept whole)
    assert _seen(res) == {"client-000": 32, "client-001": 10}
    assert res.algorithm.drop_one_sample


def test_the_engines_and_a_flower_node_train_the_same_steps_when_dropping(tmp_path):
    root = _femnist(tmp_path, [17, 5])
    a, b = (simulate(_cfg(root, batched=x)) for x in (True, False))
    cfg = _cfg(root, batched=False)
    node = simulate(cfg, train_phase=loopback_phases(cfg))  # a Flower node decides it from its own dataset
    for name, w in a.algorithm.global_params.items():
        torch.testing.assert_close(w, b.algorithm.global_params[name], atol=1e-4, rtol=1e-4)
        assert torch.equal(node.algorithm.global_params[name], b.algorithm.global_params[name])


def test_keep_is_refused_up_front_naming_a_device(tmp_path):
    root = _femnist(tmp_path, [17, 5])
    with pytest.raises(ConfigError, match=r"one_sample_batch = \"keep\": model 'vgg16' on 1x28x28 inputs gives "
                                          r"batch norm 'bn11' one value per channel .* the epochs of 1 device\(s\) end in one "
                                          r"\(the first: 'client-000'\)"):
        simulate(_cfg(root, rule="keep"))
    with pytest.raises(ConfigError, match=r"batch_size = 1: .*set batch_size to 2 or more"):
        simulate(_cfg(root, batch_size=1))


def test_keep_trains_on_every_sample_where_no_epoch_ends_alone_and_drop_applies_to_any_model(tmp_path):
    root = _femnist(tmp_path, [18, 5])  # no epoch ends in one sample: "keep" is not refused
    assert _seen(simulate(_cfg(root, rule="keep"))) == {"client-000": 36, "client-001": 10}
    root2 = _femnist(tmp_path / "b", [17, 5])
    mlp = _cfg(root2, model="mlp", args={})
    assert _seen(simulate(mlp)) == {"client-000": 34, "client-001": 10}  # no batch norm: "auto" keeps it
    drop = TrainConfig.from_dict({**mlp.to_dict(), "training": {**mlp.to_dict()["training"],
                                                                 "one_sample_batch": "drop"}})
    assert _seen(simulate(drop)) == {"client-000": 32, "client-001": 10}


def test_a_wrong_value_is_a_config_error():
    with pytest.raises(ConfigError, match="one_sample_batch"):
        TrainConfig.from_dict({"training": {"one_sample_batch": "fold"}})


def test_edgemask_train_refuses_keep_in_one_line_and_writes_no_run(tmp_path):
    root = _femnist(tmp_path / "data", [17, 5])
    (tmp_path / "t.toml").write_text(
        f'[run]\nrun_id = "osb"\n[data]\nname = "femnist"\nroot = "{root}"\nnum_clients = 2\npartition = "natural"\n'
        '[model]\nname = "vgg16"\n[model.args]\nwidth = 0.0625\n[algorithm]\nname = "fedavg"\n'
        '[training]\nrounds = 1\none_sample_batch = "keep"\n')
    p = subprocess.run([sys.executable, "-m", "edgemask.cli.main", "train", "--config", str(tmp_path / "t.toml"),
                        "--workspace", str(tmp_path / "ws")], capture_output=True, text=True)
    err = [line for line in p.stderr.splitlines() if "memory estimate" not in line]
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(err) == 1 and err[0].startswith("edgemask train: error: [training] one_sample_batch = \"keep\"")
    assert [f.name for f in (tmp_path / "ws" / "runs").iterdir()] == [".osb.lock"]  # no run, no store left
