"""ExecuTorch ``.pte`` lowered to XNNPACK, run with ``executorch.runtime.Runtime``; int8 with the XNNPACK
quantizer (PT2E: prepare, calibrate on the client's train samples, convert).

Beside each ``.pte`` goes its ETRecord (``<stem>.etrecord``, from the same lowering, so its debug handles and
delegate op lists are this very file's): the host's Inspector reads a device's ETDump with it to name the aten ops
and module paths behind each XNNPACK delegate call (``profiling.layers``). The fp32 one is the manifest's
``etrecord``.

Note: ExecuTorch 1.4.1 decomposes ``aten.lstm`` into one sub-graph per time step; lowering an 80-step LSTM
takes minutes (measured ~7 min for a 2-layer one)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgemask.fileio import atomic_path, write_bytes_atomic
from edgemask.export.formats.base import (FORMATS, ExportFormatError, Format, FormatContext, pt2e_quantized,
                                          quiet_exporters)
from edgemask.export.runtime import runtime_layout


def _lower(program_module: nn.Module, example: torch.Tensor, etrecord: Path | None = None) -> bytes:
    """The ``.pte`` bytes; with ``etrecord``, also save the ETRecord of this lowering there (atomically)."""
    with quiet_exporters():  # importing ExecuTorch logs cpuinfo lines too
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        # the program's input takes the example's dim order: trace with the layout the runtime is fed
        ep = torch.export.export(program_module, (runtime_layout(example),))
        _explicit_pool_stride(ep)
        prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                           generate_etrecord=etrecord is not None).to_executorch()
        if etrecord is not None:
            with atomic_path(etrecord) as tmp:
                prog.get_etrecord().save(str(tmp))
        return prog.buffer


def etrecord_path(pte: Path) -> Path:
    """The ETRecord written beside ``pte``: ``model.pte`` -> ``model.etrecord``."""
    return Path(pte).with_suffix(".etrecord")


def _explicit_pool_stride(ep) -> None:
    """``max_pool2d(x, k)`` leaves stride empty (= kernel size); XNNPACK's partitioner in ExecuTorch 1.4.1 reads
    ``node.args[2]`` and fails with IndexError. Write the stride out: the same op, accepted by the partitioner."""
    pools = (torch.ops.aten.max_pool2d.default, torch.ops.aten.max_pool2d_with_indices.default)
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target in pools:
            args = list(node.args)
            if len(args) == 2 or (len(args) >= 3 and not args[2]):
                args = args[:2] + [args[1]] + args[3:]
                node.args = tuple(args)
    ep.graph_module.recompile()


class Pte(Format):
    name = "pte"
    variants = ("fp32", "int8")

    def write(self, model: nn.Module, path: Path, ctx: FormatContext, variant: str = "fp32") -> dict[str, Any]:
        model = model.eval()
        if variant == "fp32":
            buf = _lower(model, ctx.example, etrecord_path(path))
        elif variant == "int8":
            with quiet_exporters():
                from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
                    XNNPACKQuantizer, get_symmetric_quantization_config)

                q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
                quantized = pt2e_quantized(model, ctx, q, path.name)
            buf = _lower(quantized, ctx.example, etrecord_path(path))
        else:
            raise ExportFormatError(f"pte: unknown variant {variant!r}; valid: {', '.join(self.variants)}")
        write_bytes_atomic(path, buf)
        return {"backend": "xnnpack", "runtime": self.runtime, "etrecord": etrecord_path(path).name}

    def run(self, path: Path, inputs: np.ndarray, threads: int = 1) -> np.ndarray:
        """A failure raises ``RuntimeError`` with the runtime's reason: its exception says only "failed with
        error 0x1", the reason is in ExecuTorch's log (which its bindings write to ``sys.stderr``), so the log's
        first line that is not cpuinfo's start-up chatter is added; the whole log goes on to the log as before."""
        log = io.StringIO()
        with quiet_exporters():  # loading the runtime logs cpuinfo lines
            from executorch.runtime import Runtime

            try:
                with contextlib.redirect_stderr(log):
                    method = Runtime.get().load_program(Path(path)).load_method("forward")
                    outs = [method.execute([torch.from_numpy(np.ascontiguousarray(x[None]))])[0] for x in inputs]
            except RuntimeError as e:
                why = next((ln.strip() for ln in log.getvalue().splitlines()
                            if ln.strip() and not ln.startswith("[cpuinfo")), None)
                raise RuntimeError(f"{e} ({why})" if why else str(e)) from None
            finally:
                sys.stderr.write(log.getvalue())  # the log, under quiet_exporters
        return torch.cat(outs).numpy().astype(np.float32)


FORMATS.add("pte", Pte())
