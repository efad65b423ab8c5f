"""PerFedMask's P^mask on ResNet18's body (the CIFAR-10 setting: ν 0.5 of the devices train the whole body, the
others half of it): the masking vectors the convergence bound's objective (``objective = "bound"``) and the
poster's printed one (``"printed"``) choose. No data needed: the choice depends on the layer sizes and budgets.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/perfedmask_objective.py [devices, default 100]
                                                                                [time limit s, default 120]

Each line ends with the MILP's status, its relative gap (objective − bound) / |objective| and its solve time.
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgemask.trainer.algorithms.perfedmask import layer_groups, solve_pmask  # noqa: E402
from edgemask.trainer.models import build_model, head_names  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
LIMIT = float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
torch.manual_seed(0)
m = build_model("resnet18", (3, 32, 32), 10)
head = set(head_names(m))
params = dict(m.named_parameters())
layers = layer_groups([k for k in params if k not in head])
sizes = [sum(params[k].numel() for k in ps) for ps in layers.values()]
d_w = sum(sizes)
rng = np.random.default_rng([0, 0x9F])
full = set(rng.permutation(N)[: int(round(0.5 * N))].tolist())
psi = [d_w * (1.0 if i in full else 0.5) for i in range(N)]
for printed in (False, True):
    t = time.time()
    sol = solve_pmask(sizes, psi, LIMIT, printed=printed)
    mm = sol.masks
    lim = [i for i in range(N) if i not in full]
    used = mm @ np.array(sizes)
    print(f"{'printed' if printed else 'bound':8} layers trained (budget-0.5 devices) {mm[lim].sum(1).mean():.1f} of {len(sizes)}, "
          f"params trained {used[lim].mean() / d_w:.3f} of the body (budget 0.5), full devices {used[sorted(full)].mean() / d_w:.3f}, "
          f"layers no device trains {(mm.sum(0) == 0).sum()}, mean trainable params {used.mean() / 1e6:.3f} M, "
          f"{sol.status}, gap {sol.gap:.1%}, objective {sol.objective:.6g}, bound {sol.bound:.6g}, {sol.seconds:.1f} s")
