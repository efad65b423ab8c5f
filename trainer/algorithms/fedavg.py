"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017): every client trains the whole model for E epochs; the server averages by sample count.
All of it is the base class's default hooks."""

from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm


@ALGORITHMS.register("fedavg")
class FedAvg(Algorithm):
    name = "fedavg"
