"""What export hands every runtime and takes back from it: inputs in the layout the runtimes are fed, and a
failure's message on one line. Shared by the formats (:mod:`edgemask.export.formats`) and the training step
(:mod:`edgemask.export.training`), which import nothing of each other at their top."""

from __future__ import annotations

import torch


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line: its first non-empty line (exporters put a blank line first), else
    its type's name; at most ``limit`` characters."""
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    line = line or type(e).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def runtime_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` with the strides of a new C-order array: the layout the runtimes are fed (numpy arrays; a board's
    ``sample_io.npz``).

    A file traced with another layout declares it for its input, and ExecuTorch holds the runtime to it:
    ``torch.from_numpy`` keeps numpy's strides, and numpy gives a size-1 dimension any stride (the digits'
    ``images[:, None]`` is (N, 1, 8, 8) with strides (64, 1, 8, 1)), which torch counts as contiguous but
    ``to_edge`` turns into the input's dim order [0, 2, 1, 3]; XNNPACK then refuses every input ("Propagating
    input shapes failed ... xnn_status_invalid_parameter"). A channels-last sample (an NHWC image transposed)
    declares [0, 2, 3, 1], and the file then reads a C-order input as NHWC: it runs and answers wrong (a small
    conv net: off by 0.28). ``clone(memory_format=contiguous_format)`` writes the standard strides even where
    ``contiguous()`` sees nothing to do."""
    return x.clone(memory_format=torch.contiguous_format)
