"""Federated algorithms, one file each, registered by name in ``ALGORITHMS``."""

from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.records import ClientUpdate, EvalModel, LocalResult, LocalTask
from edgemask.trainer.algorithms import fedavg, fedmask  # noqa: F401  (register)
from edgemask.trainer.algorithms import standalone, topk, bnn_fedavg, perfedavg, lg_fedavg  # noqa: F401  (register)
from edgemask.trainer.algorithms import fedprox, fedpews, perfedmask, fedselect  # noqa: F401  (register)
from edgemask.trainer.algorithms import fedper, fedrep, fedbabu, ditto, heterofl  # noqa: F401  (register)
from edgemask.trainer.algorithms import fednova, scaffold, moon  # noqa: F401  (register)

__all__ = ["ALGORITHMS", "Algorithm", "ClientUpdate", "EvalModel", "LocalResult", "LocalTask"]
