"""Module-tree surgery around Torch-Pruning: splitting stacked LSTMs, folding batch norm, locating outputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval


class StackedLSTM(nn.Module):
    """A stack of single-layer LSTMs, so each layer can keep its own number of live hidden units (one
    ``nn.LSTM(num_layers=L)`` forces one hidden size on all layers). Same call signature as ``nn.LSTM`` without
    an initial state; returns ``(output, (h_n, c_n))`` with the *last* layer's final state."""

    def __init__(self, layers: list[nn.LSTM]) -> None:
        super().__init__()
        self.num_layers = len(layers)
        for i, layer in enumerate(layers):
            setattr(self, f"layer{i}", layer)

    def forward(self, x: torch.Tensor, hx=None):
        if hx is not None:
            raise ValueError("StackedLSTM (compacted) takes no initial state")
        state = None
        for i in range(self.num_layers):
            x, state = getattr(self, f"layer{i}")(x)  # (B, T, H_i)
        return x, state


def split_lstm(lstm: nn.LSTM) -> StackedLSTM:
    """The same computation as ``lstm`` (zero initial state) as a :class:`StackedLSTM` of 1-layer LSTMs."""
    layers = []
    for i in range(lstm.num_layers):
        inp = lstm.input_size if i == 0 else lstm.hidden_size
        one = nn.LSTM(inp, lstm.hidden_size, 1, bias=lstm.bias, batch_first=lstm.batch_first)
        with torch.no_grad():
            for k in ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if lstm.bias else ()):
                getattr(one, f"{k}_l0").copy_(getattr(lstm, f"{k}_l{i}"))
        layers.append(one)
    return StackedLSTM(layers).eval()


def get_module(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path) if path else root


def set_module(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(get_module(root, parent), leaf, new)


def fold_batch_norms(model: nn.Module, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Fold each (conv, bn) pair into the conv (``fuse_conv_bn_eval``) and replace the bn by ``nn.Identity``."""
    done = []
    for conv_name, bn_name in pairs:
        conv, bn = get_module(model, conv_name), get_module(model, bn_name)
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or not isinstance(conv, (nn.Conv1d, nn.Conv2d)):
            continue
        set_module(model, conv_name, fuse_conv_bn_eval(conv.eval(), bn.eval()))
        set_module(model, bn_name, nn.Identity())
        done.append((conv_name, bn_name))
    return done


def output_layers(model: nn.Module, example: tuple[torch.Tensor, ...]) -> list[str]:
    """Names of the modules whose output tensor *is* the model's output (their output units are never removed)."""
    seen: dict[int, str] = {}
    hooks = []
    for name, mod in model.named_modules():
        if name and not list(mod.children()):
            hooks.append(mod.register_forward_hook(
                lambda m, i, o, name=name: seen.__setitem__(id(o), name) if isinstance(o, torch.Tensor) else None))
    try:
        with torch.no_grad():
            out = model(*example)
    finally:
        for h in hooks:
            h.remove()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [seen[id(o)] for o in outs if id(o) in seen]
