"""Datasets and client partitions. Importing this package registers every builder."""

from trainer.data.base import DATASETS, ClientData, DataConfig, FederatedDataset, build_dataset, client_id
from trainer.data import embedded  # noqa: F401  (registers digits)

__all__ = ["DATASETS", "ClientData", "DataConfig", "FederatedDataset", "build_dataset", "client_id"]
