"""FedPeWS's CNN against its paper's Table 5 (App. B.1): the layer shapes and the parameter count, by hand."""

from __future__ import annotations

import torch

from edgemask.trainer.models import build_model


def test_fedpews_cnn_is_table_5():
    # Table 5: Input [3, 32, 32], Conv1 [3, 32, 3, 3], Conv2 [32, 64, 3, 3], Conv3 [64, 128, 3, 3], Flatten [2048],
    # FC [2048, 20]; each conv followed by a 2×2 max pool of stride 2 (32 -> 16 -> 8 -> 4: 128 × 4 × 4 = 2048).
    model = build_model("fedpews_cnn", (3, 32, 32), 20)
    shapes = {k: tuple(v.shape) for k, v in model.named_parameters()}
    assert shapes == {
        "conv1.weight": (32, 3, 3, 3), "conv1.bias": (32,),
        "conv2.weight": (64, 32, 3, 3), "conv2.bias": (64,),
        "conv3.weight": (128, 64, 3, 3), "conv3.bias": (128,),
        "out.weight": (20, 2048), "out.bias": (20,),
    }
    # 3·32·9 + 32 = 896; 32·64·9 + 64 = 18,496; 64·128·9 + 128 = 73,856; 2048·20 + 20 = 40,980
    assert sum(p.numel() for p in model.parameters()) == 896 + 18_496 + 73_856 + 40_980 == 134_228
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 20)
    # MedMNIST's 28×28 pools to 4×4 too (ceil mode: 28 -> 14 -> 7 -> 4), so the FC stays 2048 wide
    assert build_model("fedpews_cnn", (3, 28, 28), 20).out.weight.shape == (20, 2048)
