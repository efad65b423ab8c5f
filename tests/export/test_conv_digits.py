"""Conv models trained on digits export to every format (issue #44): a file is traced in the layout its runtime is
fed, a layer a runtime cannot run is named and its format left out, any other runtime failure is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import user_models  # noqa: F401 - registers user_sortnet and user_sortnet_inline
from edgemask.errors import EdgemaskError
from edgemask.export import TOLERANCE, export_run, load_sample_io
from edgemask.export.formats import FORMATS, FormatContext
from edgemask.export.pipeline import export_client
from edgemask.manifest import load_artifact
from export_helpers import random_masks
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import build_model
from edgemask.trainer.run_dir import ClientState, load_run, write_run
from edgemask.trainer.simulation import train

# small widths: one round on 2 × 120 digits trains in seconds
CONV = {"cnn": {"widths": [4, 8]}, "vgg16": {"width": 1 / 16}, "resnet18": {"width": 1 / 16},
        "tiny_mobilenet": {"width": 4, "expand": 2}}


def trained(tmp_path, model: str, args: dict):
    """A FedMask run of ``model`` on digits, one round, trained by the trainer (configs/digits-fedmask.toml's
    settings, fewer samples)."""
    cfg = TrainConfig.from_dict({
        "run": {"seed": 0, "run_id": f"digits-{model}"},
        "data": {"name": "digits", "num_clients": 2, "samples_per_client": 120},
        "model": {"name": model, "args": args},
        "algorithm": {"name": "fedmask", "args": {"prune_rate": 0.2, "prune_last": 2, "lambda_r": 0.002}},
        "training": {"rounds": 1, "local_epochs": 1, "batch_size": 16, "lr": 100.0, "momentum": 0.9}})
    return load_run(train(cfg, tmp_path / "runs"))


def test_a_cnn_trained_on_digits_exports_to_pte_and_runs_as_a_board_feeds_it(tmp_path):
    # Before: "XNNExecutor.cpp:169] Internal Error: Propagating input shapes failed ... xnn_status_invalid_parameter",
    # then a traceback: the digits' samples (strides (64, 1, 8, 1)) gave the .pte an input dim order [0, 2, 1, 3]
    run = trained(tmp_path, "cnn", CONV["cnn"])
    dest = export_client(run, "client-000", tmp_path / "a" / run.run_id / "client-000", ["pte"])
    m = load_artifact(dest)
    assert m.tolerance["max_abs_diff"]["pte"] <= TOLERANCE.atol
    io = load_sample_io(dest / "sample_io.npz")  # what a board reads: fresh C-order arrays
    got = FORMATS.get("pte").run(dest / m.file_for("pte").file, io["input"])
    assert TOLERANCE.compare(io["output"], got).ok


class _Conv(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.parametrize("channels, layout", [(1, "size-1 channel, stride 1"), (3, "channels last")])
def test_a_pte_traced_from_a_sample_of_another_layout_reads_c_order_inputs(tmp_path, channels, layout):
    """The cause, without a run: an example whose strides are not C order's. A size-1 channel of stride 1 (numpy's
    ``images[:, None]``) made a file XNNPACK refuses; a channels-last one made a file that reads C-order inputs as
    NHWC and answers wrong. Traced in the runtimes' layout, both compute what torch does."""
    torch.manual_seed(0)
    model = _Conv(channels).eval()
    x = torch.rand(4, 8, 8, channels).permute(0, 3, 1, 2)  # an NHWC batch seen as NCHW: (4, C, 8, 8)
    assert x.stride()[1] == 1  # channels-last strides (for C = 1: (64, 1, 8, 1), the digits' layout)
    f = FORMATS.get("pte")
    path = tmp_path / "model.pte"
    f.write(model, path, FormatContext(x[:1]))
    inputs = np.ascontiguousarray(x.numpy())  # C order, as the runtimes are fed
    with torch.no_grad():
        want = model(torch.from_numpy(inputs)).numpy()
    assert TOLERANCE.compare(want, f.run(path, inputs)).ok, layout


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(CONV))
def test_each_conv_model_trained_on_digits_exports_to_every_format(tmp_path, model):
    """onnx, pte, tflite and the local step: torch-train everywhere; pte-train where ExecuTorch trains the model
    (not through batch norm: it has no training kernel for it, and says so; tests/export/test_training_step.py)."""
    run = trained(tmp_path, model, CONV[model])
    formats = ["onnx", "pte", "tflite", "torch-train"] + (["pte-train"] if model == "cnn" else [])
    dest = export_client(run, "client-000", tmp_path / "a" / run.run_id / "client-000", formats)
    m = load_artifact(dest)  # every file's digest and size checked
    assert sorted(f.format for f in m.files) == sorted(formats)
    for f in m.files:
        assert f.max_abs_diff is not None
        if f.format in ("torch-train", "pte-train"):
            assert m.training["max_abs_diff"][f.format] <= m.training["limit"]
        else:
            assert m.tolerance["max_abs_diff"][f.format] <= TOLERANCE.atol


def _sortnet_run(tmp_path, name: str):
    cfg = TrainConfig(run=RunConfig(seed=0, run_id=f"digits-{name}"), data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig(name, {}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model(name, (1, 8, 8), 10)
    clients = {f"client-00{i}": ClientState(masks=random_masks(model, 0.4, seed=i)) for i in range(2)}
    return load_run(write_run(tmp_path / "runs" / cfg.run_id, cfg, model.state_dict(), clients, [],
                              {"run_id": cfg.run_id, "clients": {}}))


def test_a_layer_executorch_cannot_run_is_named_and_the_other_formats_written(tmp_path):
    run = _sortnet_run(tmp_path, "user_sortnet")
    dest = tmp_path / "a" / run.run_id / "client-000"
    with pytest.warns(UserWarning) as warned:
        export_client(run, "client-000", dest, ["onnx", "pte"])
    lines = [str(w.message) for w in warned if "left out" in str(w.message)]
    assert lines == [f"{run.run_id}/client-000: pte left out: executorch cannot run layer 'sort' (SortLast): Failed "
                     "to load method forward, error: 0x:14 ([operator_registry.cpp:277] kernel 'aten::sort.values' "
                     "not found.); the rest of the artifact is written"]
    m = load_artifact(dest)
    assert [f.format for f in m.files] == ["onnx"] and m.tolerance["max_abs_diff"]["onnx"] <= TOLERANCE.atol
    assert m.etrecord is None
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "model.onnx", "sample_io.npz"]


def test_a_runtime_failure_no_layer_explains_is_one_line_naming_client_format_and_message(tmp_path):
    # the same sort, written in the model's forward: every layer runs alone, the model does not
    run = _sortnet_run(tmp_path, "user_sortnet_inline")
    with pytest.raises(EdgemaskError) as e:
        export_run(run.path, tmp_path / "a", ["client-000"], ["onnx", "pte"], progress=False)
    assert str(e.value) == (f"{run.run_id}/dense: pte: executorch failed to run model.pte: Failed to load method "
                            "forward, error: 0x:14 ([operator_registry.cpp:277] kernel 'aten::sort.values' not "
                            "found.)")
    assert not (tmp_path / "a" / run.run_id / "dense").exists()
