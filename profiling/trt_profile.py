"""TensorRT's layer names back to the ONNX nodes they fuse, and so to the mask's layers.

TensorRT builds an engine whose layers are fusions of ONNX nodes; trtexec's ``--exportProfile`` times the engine's
layers (devices/remote/runner/trt_files.py reads the file on the board). Names, as TensorRT 8.0/8.2 write them:

- ``"Conv_0 + BatchNormalization_1 + Relu_2"``: a fusion; its nodes joined by ``" + "``;
- ``"PWN(Relu_3, Add_4)"`` / ``"PWN(PWN(Sigmoid_5), Mul_6)"``: a pointwise fusion of the nodes named inside;
- ``"Reformatting CopyNode for Input Tensor 0 to Conv_0"``: a layout/precision reformat TensorRT inserts; no node;
- ``"{ForeignNode[Gemm_7...Relu_12]}"``: a Myelin subgraph, timed as one layer; only its first and last node are
  named, so it cannot be split — reported as a block, never guessed at;
- ``"(Unnamed Layer* 12) [Shuffle]"``: a layer the ONNX parser added; no node.

A fusion's time goes to the layer of its first node (:data:`FUSED_ATTRIBUTION`): TensorRT fuses a producer
(convolution, matrix multiply) with the pointwise nodes that consume it, and the producer's kernel does the work,
the rest being its epilogue; the nodes a mask's layer owns are those of that producer.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

# How a fused layer's time is attributed when its nodes belong to more than one mask layer: "first" = all of it
# to the layer of the first node that has one (the producer whose kernel TensorRT extends with the rest).
FUSED_ATTRIBUTION = "first"
REFORMAT_PREFIX = "Reformatting CopyNode"
_FOREIGN = re.compile(r"^\{?ForeignNode\[(.*)\]\}?$")
_PWN = re.compile(r"PWN\(")


def is_foreign_node(name: str) -> bool:
    """A Myelin subgraph (TensorRT times it as one layer; its inner nodes are not listed)."""
    return bool(_FOREIGN.match(name.strip()))


def split_fused(name: str) -> list[str] | None:
    """The ONNX node names a TensorRT layer name fuses, in order; [] for a layer with no ONNX node (reformat,
    parser-made shuffle); None for a Myelin ForeignNode, which cannot be split.

    >>> split_fused("Conv_0 + BatchNormalization_1 + Relu_2")
    ['Conv_0', 'BatchNormalization_1', 'Relu_2']
    >>> split_fused("PWN(PWN(Sigmoid_5), Mul_6)")
    ['Sigmoid_5', 'Mul_6']
    """
    name = name.strip()
    if is_foreign_node(name):
        return None
    if name.startswith(REFORMAT_PREFIX) or name.startswith("(Unnamed Layer*"):
        return []
    parts: list[str] = []
    for part in name.split(" + "):
        part = part.strip()
        if _PWN.match(part):
            inner = _PWN.sub("", part).replace(")", "")
            parts.extend(p.strip() for p in inner.split(",") if p.strip())
        elif part:
            parts.append(part)
    return parts


def trt_layer_of(name: str, index: Mapping[str, str], layer_of: Callable[[str, Mapping[str, str]], str],
                 other: str) -> str:
    """The mask layer a TensorRT layer's time goes to: the layer of its first node that has one
    (:data:`FUSED_ATTRIBUTION`), ``other`` for reformats, parser-made layers, ForeignNodes and nodes no layer
    owns. ``layer_of`` resolves one node name (profiling.layers.layer_of)."""
    nodes = split_fused(name)
    for node in nodes or []:
        layer = layer_of(node, index)
        if layer != other:
            return layer
    return other
