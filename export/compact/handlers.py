"""One handler per layer kind, in a table keyed by layer type.

A handler says, for its layer kind:

* ``out_units(module)``: how many output units (rows, filters, hidden units) it has;
* ``zero_units(name, module, dead)``: which output units are *exactly zero whatever the input* — ``dead`` is the
  masks' verdict (:func:`edgemask.trainer.models.masking.unit_alive`), and the baked weights must prove it (rows and
  bias zero), so a mask/weight disagreement keeps the unit rather than changing the output;
* ``zero_inputs(module, rows)``: which input units (columns, input channels) the layer never reads — their
  columns in the baked weights are zero in every row that stays (``rows``: bool per output unit). Group lasso
  (FedMask Eq. 9) drives mask columns to zero as well as rows; a unit no consumer reads can go;
* ``macs(module, inputs, output)``: multiply-accumulates of one forward call (the FLOP counter's per-layer term);
* ``pruner``: the surgery that removes output units and matching input units — Torch-Pruning's own for conv,
  linear and batch norm (exact here), ours for the LSTM (Torch-Pruning's is broken: wrong index sizes, and it
  asserts ``num_layers == 1``).

A new layer kind is one new class and one :func:`register_handler` call.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch_pruning as tp
from torch import nn

from edgemask.errors import EdgemaskError


class UnsupportedLayerError(EdgemaskError):
    """A layer compaction cannot handle exactly (e.g. grouped non-depthwise conv)."""


class LayerHandler:
    """Base handler: a layer whose output units are never known to be zero (kept), with no MAC count."""

    pruner: tp.pruner.function.BasePruningFunc | None = None

    def check(self, name: str, module: nn.Module) -> None:
        """Raise :class:`UnsupportedLayerError` when this layer cannot be compacted exactly."""

    def out_units(self, module: nn.Module) -> int:
        raise NotImplementedError

    def zero_units(self, name: str, module: nn.Module, dead: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros(self.out_units(module), dtype=torch.bool)

    def zero_inputs(self, module: nn.Module, rows: torch.Tensor) -> torch.Tensor | None:
        """Bool per input unit: its column is zero in every output row ``rows`` keeps; None when the layer
        does not read input units through columns (not a consumer the column rule can clear)."""
        return None

    def macs(self, module: nn.Module, inputs: tuple, output) -> int:
        return 0


def _rows_zero(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    z = weight.detach().reshape(weight.shape[0], -1).eq(0).all(1)
    if bias is not None:
        z &= bias.detach().eq(0)
    return z


def _cols_zero(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Bool per input unit (dim 1 of ``weight``, (out, in, *kernel)): zero in every row ``rows`` keeps."""
    w = weight.detach()[rows]
    return w.transpose(0, 1).reshape(w.shape[1], -1).eq(0).all(1)


class LinearHandler(LayerHandler):
    def out_units(self, module: nn.Linear) -> int:
        return module.out_features

    def zero_units(self, name, module, dead):
        if dead is None:
            return torch.zeros(module.out_features, dtype=torch.bool)
        return dead & _rows_zero(module.weight, module.bias)

    def zero_inputs(self, module, rows):
        return _cols_zero(module.weight, rows)

    def macs(self, module, inputs, output) -> int:
        return output.numel() // output.shape[0] * module.in_features  # per sample


class ConvHandler(LayerHandler):
    """Conv1d/Conv2d: plain and depthwise (groups == in == out channels). Other grouped convs are refused: the
    group structure ties output units to input slices, and Torch-Pruning's surgery on them was found wrong here."""

    def check(self, name, module) -> None:
        g = module.groups
        depthwise = g == module.in_channels == module.out_channels
        if g != 1 and not depthwise:
            raise UnsupportedLayerError(
                f"layer {name!r}: grouped convolution (groups={g}, {module.in_channels}→{module.out_channels}) "
                f"is not supported by compaction; use groups=1 or a depthwise conv, or register a handler "
                f"with export.compact.register_handler")

    def out_units(self, module) -> int:
        return module.out_channels

    def zero_units(self, name, module, dead):
        if dead is None:
            return torch.zeros(module.out_channels, dtype=torch.bool)
        return dead & _rows_zero(module.weight, module.bias)

    def zero_inputs(self, module, rows):
        if module.groups != 1:  # depthwise: channel j reads only input j, a per-channel op (the row rule's)
            return None
        return _cols_zero(module.weight, rows)

    def macs(self, module, inputs, output) -> int:
        per_out = module.in_channels // module.groups
        for k in module.kernel_size:
            per_out *= k
        return output.numel() // output.shape[0] * per_out


class BatchNormHandler(LayerHandler):
    """Batch norm outputs exactly β where γ = 0: a channel with γ = β = 0 is zero whatever came in (bake gates
    both for a dead layer's units — without that, β − γ·μ/σ would leak through)."""

    def out_units(self, module) -> int:
        return module.num_features

    def zero_units(self, name, module, dead):
        if module.weight is None:
            return torch.zeros(module.num_features, dtype=torch.bool)
        return module.weight.detach().eq(0) & module.bias.detach().eq(0)


class LSTMPruner(tp.pruner.function.BasePruningFunc):
    """Torch-Pruning surgery for a single-layer, unidirectional ``nn.LSTM`` (compaction splits stacked LSTMs).

    Hidden unit j owns rows j, H+j, 2H+j, 3H+j (gates i, f, g, o) of ``weight_ih``, ``weight_hh`` and both biases,
    and column j of ``weight_hh`` (the recurrence); its consumers' inputs are pruned by their own handlers.
    """

    TARGET_MODULES = (nn.LSTM,)

    def prune_out_channels(self, layer: nn.LSTM, idxs: Sequence[int]) -> nn.LSTM:
        if layer.num_layers != 1:
            raise UnsupportedLayerError("LSTMPruner handles single-layer LSTMs; split stacked ones first")
        h = layer.hidden_size
        keep = sorted(set(range(h)) - set(int(i) for i in idxs))
        rows = torch.tensor([g * h + j for g in range(4) for j in keep], dtype=torch.long)
        cols = torch.tensor(keep, dtype=torch.long)
        with torch.no_grad():
            layer.weight_ih_l0 = nn.Parameter(layer.weight_ih_l0[rows].clone())
            layer.weight_hh_l0 = nn.Parameter(layer.weight_hh_l0[rows][:, cols].clone())
            if layer.bias:
                layer.bias_ih_l0 = nn.Parameter(layer.bias_ih_l0[rows].clone())
                layer.bias_hh_l0 = nn.Parameter(layer.bias_hh_l0[rows].clone())
        layer.hidden_size = len(keep)
        layer._flat_weights_names = layer._flat_weights_names  # names unchanged; refresh the flat list
        layer._init_flat_weights()
        return layer

    def prune_in_channels(self, layer: nn.LSTM, idxs: Sequence[int]) -> nn.LSTM:
        keep = sorted(set(range(layer.input_size)) - set(int(i) for i in idxs))
        cols = torch.tensor(keep, dtype=torch.long)
        with torch.no_grad():
            layer.weight_ih_l0 = nn.Parameter(layer.weight_ih_l0[:, cols].clone())
        layer.input_size = len(keep)
        layer._init_flat_weights()
        return layer

    def get_out_channels(self, layer: nn.LSTM) -> int:
        return layer.hidden_size

    def get_in_channels(self, layer: nn.LSTM) -> int:
        return layer.input_size


class LSTMHandler(LayerHandler):
    """``nn.LSTM`` (single layer after compaction's split). A hidden unit is zero when its g rows (input and
    recurrent) and g biases are zero: then g = 0, c stays 0 and h = o·tanh(0) = 0."""

    pruner = LSTMPruner()

    def check(self, name, module) -> None:
        if module.bidirectional or module.proj_size:
            raise UnsupportedLayerError(f"layer {name!r}: bidirectional / projected LSTMs are not supported")

    def out_units(self, module) -> int:
        return module.hidden_size

    def zero_units(self, name, module, dead):
        h = module.hidden_size
        if dead is None:
            return torch.zeros(h, dtype=torch.bool)
        g = slice(2 * h, 3 * h)
        z = dead & module.weight_ih_l0[g].detach().eq(0).all(1) & module.weight_hh_l0[g].detach().eq(0).all(1)
        if module.bias:
            z &= module.bias_ih_l0[g].detach().eq(0) & module.bias_hh_l0[g].detach().eq(0)
        return z

    def macs(self, module, inputs, output) -> int:
        x = inputs[0]  # (B, T, I) batch-first or (T, B, I)
        steps = x.shape[1] if module.batch_first else x.shape[0]
        total, i = 0, module.input_size
        for _ in range(module.num_layers):
            total += steps * 4 * module.hidden_size * (i + module.hidden_size)
            i = module.hidden_size
        return total


class EmbeddingHandler(LayerHandler):
    def out_units(self, module) -> int:
        return module.embedding_dim


HANDLERS: dict[type, LayerHandler] = {}


def register_handler(layer_type: type, handler: LayerHandler) -> LayerHandler:
    """Register how compaction treats ``layer_type`` (subclasses included, nearest class wins)."""
    HANDLERS[layer_type] = handler
    return handler


def handler_for(module: nn.Module) -> LayerHandler | None:
    for cls in type(module).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    return None


for _t in (nn.Linear,):
    register_handler(_t, LinearHandler())
for _t in (nn.Conv1d, nn.Conv2d):
    register_handler(_t, ConvHandler())
for _t in (nn.BatchNorm1d, nn.BatchNorm2d):
    register_handler(_t, BatchNormHandler())
register_handler(nn.LSTM, LSTMHandler())
register_handler(nn.Embedding, EmbeddingHandler())
