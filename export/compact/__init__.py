"""Compaction of a client's masked model into a smaller dense network (see :mod:`edgemask.export.compact.compact`)."""

from edgemask.export.compact.compact import AllDeadLayerError, CompactionResult, LayerStat, compact
from edgemask.export.compact.flops import count_flops, count_params
from edgemask.export.compact.graph import StackedLSTM, split_lstm
from edgemask.export.compact.handlers import (HANDLERS, LayerHandler, LSTMPruner, UnsupportedLayerError, handler_for,
                                     register_handler)

__all__ = [
    "AllDeadLayerError", "CompactionResult", "HANDLERS", "LSTMPruner", "LayerHandler", "LayerStat",
    "StackedLSTM", "UnsupportedLayerError", "compact", "count_flops", "count_params", "handler_for",
    "register_handler", "split_lstm",
]
