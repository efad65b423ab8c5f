"""Datasets and client partitions. Importing this package registers every builder.

Registered: ``digits`` and ``synthetic`` (no files needed); ``cifar10``, ``mnist``, ``cifar_mnist``, ``medmnist``,
``femnist``, ``shakespeare`` and ``har`` (read from local copies in their standard formats, never downloaded).
"""

from edgemask.trainer.data.base import (DATASETS, ClientData, DataConfig, DatasetMissingError, FederatedDataset,
                               build_dataset, client_id)
from edgemask.trainer.data import embedded  # noqa: F401  (registers digits)
from edgemask.trainer.data import synthetic, cifar, mnist, cifar_mnist, medmnist, leaf, har  # noqa: F401  (register)

__all__ = ["DATASETS", "ClientData", "DataConfig", "DatasetMissingError", "FederatedDataset", "build_dataset",
           "client_id"]
