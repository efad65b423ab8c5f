"""Which layer a format cannot take: when a model's file fails to convert or to run, each layer is exported and
run alone, in execution order, with the input it receives in the model; the first that fails alone is the one
the converter or runtime cannot take (an operator ExecuTorch has no kernel for, an op outside its Core ATen set).

Only leaf modules called with one tensor and returning another are tried (an ``nn.Identity`` or an eval-mode
dropout, which hand their input back, are not: a program whose output is its input is no layer). A failure no
single layer reproduces (the layers work alone, not together) names no layer: the model's failure then stands
as an error, not as a layer the format cannot take.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from edgemask.export.formats.base import Format, FormatContext
from edgemask.export.runtime import one_line


@dataclass(frozen=True)
class FailingLayer:
    name: str  # module path in the exported (compacted) model
    kind: str  # the module's class name
    reason: str  # the converter's or runtime's message, one line
    stage: str  # "convert" | "run"

    def describe(self, fmt: Format) -> str:
        """One line: ``executorch cannot run layer 'pool' (SortPool): <reason>``; where the conversion failed,
        ``its converter cannot take layer ...``."""
        who = f"{fmt.runtime} cannot run" if self.stage == "run" else "its converter cannot take"
        return f"{who} layer {self.name!r} ({self.kind}): {self.reason}"


def leaf_calls(model: nn.Module, example: torch.Tensor) -> list[tuple[str, nn.Module, torch.Tensor]]:
    """``(path, module, its input)`` of each leaf module's first call in one forward of ``example``, in call
    order; inputs are detached copies (batch 1, as the runtimes are fed)."""
    calls: list[tuple[str, nn.Module, torch.Tensor]] = []
    seen: set[str] = set()
    hooks = []
    for name, mod in model.named_modules():
        if not name or any(True for _ in mod.children()):
            continue

        def hook(m, args, out, name=name):
            if name in seen or len(args) != 1 or not isinstance(args[0], torch.Tensor):
                return
            if not isinstance(out, torch.Tensor) or out is args[0]:
                return
            seen.add(name)
            calls.append((name, m, args[0].detach().clone()))

        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model.eval()(example)
    finally:
        for h in hooks:
            h.remove()
    return calls


def failing_layer(fmt: Format, model: nn.Module, ctx: FormatContext, workdir: Path) -> FailingLayer | None:
    """The first layer of ``model`` (in call order) that ``fmt`` fails to convert or run alone, in fp32;
    None when each converts and runs. Files go to ``workdir/.layers`` and are removed."""
    scratch = Path(workdir) / ".layers"
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        for i, (name, mod, x) in enumerate(leaf_calls(model, ctx.example)):
            path = scratch / f"{i}-{fmt.filename('fp32')}"
            alone = copy.deepcopy(mod).eval()
            stage = "convert"
            try:
                fmt.write(alone, path, FormatContext(x, ctx.settings), "fp32")
                stage = "run"
                fmt.run(path, x.numpy())
            except Exception as e:  # whatever the converter or runtime raises: the layer is what it fails on
                return FailingLayer(name, type(mod).__name__, one_line(e), stage)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None
