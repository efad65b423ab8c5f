"""history.parquet's samples_seen: what each sampled client's local training processed in a round (the replay's
FedScale batch × local steps, profiling/replay.py)."""

from edgemask.trainer.config import TrainConfig
from edgemask.trainer.simulation import simulate


def test_samples_seen_is_every_epoch_of_the_clients_training_split():
    cfg = TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": 2, "samples_per_client": 40},
        "model": {"name": "mlp"}, "algorithm": {"name": "fedavg", "args": {}},
        "training": {"rounds": 2, "local_epochs": 3, "batch_size": 16, "lr": 0.05, "momentum": 0.9}})
    res = simulate(cfg)
    seen = {(r["round"], r["client"]): r["value"] for r in res.history if r["metric"] == "samples_seen"}
    n_train = {cid: res.algorithm.dataset.client(cid).num_train for cid in res.algorithm.client_ids}
    # 3 epochs over each client's whole training split (the last partial batch included), in both rounds
    assert seen == {(rnd, cid): 3 * n for rnd in (0, 1) for cid, n in n_train.items()}
