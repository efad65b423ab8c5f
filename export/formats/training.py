"""The training formats (issue #39): a client's local step (:class:`edgemask.export.training.TrainStep`) for the
board, each with its host runtime to prove one step equal to torch's.

* ``pte-train``: ExecuTorch's joint forward-backward program (``_export_forward_backward``, then ``to_edge`` and
  ``to_executorch``, portable kernels: the training example ExecuTorch 1.5.1 ships in its wheel). The runtime is
  ``executorch.extension.training``: ``TrainingModule.forward_backward`` returns the loss and fills the gradients,
  ``get_sgd_optimizer`` steps the parameters in place.
* ``torch-train``: the step as a ``torch.export`` program (``torch.export.save``), loaded with
  ``torch.export.load(...).module()`` by torch on the board's own Python, stepped by ``loss.backward()`` and
  ``torch.optim.SGD``: the fallback for a board where ExecuTorch cannot take the step or runs it slowly.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgemask.fileio import write_bytes_atomic
from edgemask.export.formats.base import FORMATS, ExportFormatError, Format, FormatUnavailableError, quiet_exporters


class TrainingFormat(Format):
    """A format of a local step. ``write_step`` writes ``step`` (traced with the minibatch ``x``, ``y``);
    ``run_step`` loads the file in its runtime on the host, runs ``steps`` SGD steps and returns (losses, the
    trained tensors ``t<i>`` after them, as arrays in order)."""

    training = True

    def write(self, model, path, ctx, variant="fp32"):  # an inference model is not a training step
        raise ExportFormatError(f"{path}: format {self.name} writes a training step, not a model")

    def write_step(self, step: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, path: Path) -> dict[str, Any]:
        """Write the step to ``path`` (a temporary name: a refusal says why, the caller names the file)."""
        raise NotImplementedError

    def run_step(self, path: Path, x: np.ndarray, y: np.ndarray, lr: float, momentum: float, n_trained: int,
                 steps: int = 1) -> tuple[list[float], list[np.ndarray]]:
        raise NotImplementedError


def _max_pool_backward() -> dict:
    """torch's own decomposition of ``max_pool2d_with_indices_backward`` (zeros, then ``scatter_add`` of the output
    gradient at the forward's indices). ExecuTorch 1.5.1's portable kernel for it adds into its output without
    clearing it first: the gradient of every conv before a max-pool took what the memory plan left there (a
    conv-maxpool step: 154 off a gradient of 0.07, and a different value at each call); the decomposed step
    matches torch's within 1e-7."""
    from torch._decomp import decomposition_table

    op = torch.ops.aten.max_pool2d_with_indices_backward.default
    return {op: decomposition_table[op]}


class PteTrainFormat(TrainingFormat):
    name = "pte-train"

    def check_available(self) -> None:
        try:
            with quiet_exporters():  # importing ExecuTorch logs cpuinfo lines
                import executorch.extension.training  # noqa: F401
        except ImportError as e:
            raise FormatUnavailableError(f"format pte-train needs ExecuTorch's training extension ({e}); "
                                         "pip install executorch==1.5.1") from None

    def write_step(self, step, x, y, path):
        with quiet_exporters():
            from executorch.exir import EdgeCompileConfig, to_edge
            from torch.export.experimental import _export_forward_backward

            try:
                ep = _export_forward_backward(torch.export.export(step, (x, y), strict=False))
                ep = ep.run_decompositions(_max_pool_backward())
                prog = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
            except Exception as e:  # the exporters raise many kinds; the message says which step and why
                raise ExportFormatError(f"ExecuTorch cannot export this training step "
                                        f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
        write_bytes_atomic(path, prog.buffer)
        return {"runtime": self.runtime, "backend": "portable"}

    def run_step(self, path, x, y, lr, momentum, n_trained, steps=1):
        with quiet_exporters():
            from executorch.extension.training import _load_for_executorch_for_training_from_buffer, \
                get_sgd_optimizer

            data = Path(path).read_bytes()  # the module reads this buffer in place: it must outlive the module
            mod = _load_for_executorch_for_training_from_buffer(data)
        xs, ys = torch.from_numpy(x), torch.from_numpy(y)
        losses, opt = [], None
        for _ in range(steps):
            out = mod.forward_backward("forward", (xs, ys))
            if opt is None:
                opt = get_sgd_optimizer(mod.named_parameters(), lr, momentum)
            opt.step(mod.named_gradients())
            losses.append(float(out[0]))
        params = mod.named_parameters()
        del data
        return losses, [params[f"t{i}"].detach().numpy().copy() for i in range(n_trained)]


class TorchTrainFormat(TrainingFormat):
    name = "torch-train"

    def write_step(self, step, x, y, path):
        with quiet_exporters():
            try:
                ep = torch.export.export(step, (x, y), strict=False)
                buf = io.BytesIO()
                torch.export.save(ep, buf)
            except Exception as e:
                raise ExportFormatError(f"torch.export cannot export this training step "
                                        f"({type(e).__name__}: {' '.join(str(e).split())[:300]})") from None
        write_bytes_atomic(path, buf.getvalue())
        return {"runtime": self.runtime}

    def run_step(self, path, x, y, lr, momentum, n_trained, steps=1):
        with quiet_exporters():
            module = torch.export.load(io.BytesIO(Path(path).read_bytes())).module()
        from edgemask.export.training import sgd_steps

        params = dict(module.named_parameters())
        trained = [params[f"t{i}"] for i in range(n_trained)]
        losses = sgd_steps(module, trained, torch.from_numpy(x), torch.from_numpy(y), lr, momentum, steps)
        return losses, [t.detach().numpy().copy() for t in trained]


FORMATS.add("pte-train", PteTrainFormat())
FORMATS.add("torch-train", TorchTrainFormat())
