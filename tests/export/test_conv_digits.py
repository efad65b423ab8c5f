"""Conv models trained on digits export to ExecuTorch (issue #44): a file is traced in the layout its runtime is
fed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgemask.export import TOLERANCE, load_sample_io
from edgemask.export.formats import FORMATS, FormatContext
from edgemask.export.pipeline import export_client
from edgemask.manifest import load_artifact
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.run_dir import load_run
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
