"""`edgemask report` with `[runner] profile_layers = true`: a real run exported to ONNX, profiled on the `local`
device through the runner, and the per-layer table in the Markdown summary (hand-computed FLOP ratios)."""

from __future__ import annotations

import pytest
import torch

from edgemask.export import export_run
from edgemask.profiling.campaign import parse_campaign, run_campaign
from edgemask.profiling.report import write_report
from edgemask.profiling.store import ResultsStore
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import build_model, model_sites
from edgemask.trainer.models.masking import all_ones_masks
from edgemask.trainer.run_dir import ClientState, write_run


@pytest.mark.slow
def test_report_shows_where_the_time_goes_per_layer(tmp_path):
    ws = tmp_path / "ws"
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-cnn-layers"),
                      data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("cnn", {}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    masks = all_ones_masks(model, tuple(s for s in model_sites(model) if s.name != "out"))
    masks["conv1.weight"][2:] = 0  # conv1 keeps 2 of its 16 filters
    clients = {f"client-00{i}": ClientState(masks={k: v.clone() for k, v in masks.items()}) for i in range(2)}
    write_run(ws / "runs" / cfg.run.run_id, cfg, model.state_dict(), clients, [],
              {"run_id": cfg.run.run_id, "clients": {}})
    export_run(ws / "runs" / cfg.run.run_id, ws / "artifacts", formats=("onnx",), progress=False)

    camp = parse_campaign({
        "campaign": {"name": "layers", "formats": ["onnx"], "devices": ["local"], "threads": [1], "retries": 0},
        "artifacts": [{"run": cfg.run.run_id, "clients": ["client-000"], "dense": True}],
        "runner": {"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 5, "min_seconds": 0.01, "idle_seconds": 0.0,
                   "profile_layers": True, "profile_runs": 6, "profile_warmup": 2}})
    run_campaign(camp, ws, progress=False)
    results = camp.results_dir(ws)
    with ResultsStore.open(results / "results.sqlite") as store:
        assert len(store.operator_samples()) >= 2 * 6 * 3  # 2 artifacts × 6 runs × (at least) the 3 layers
        assert store.profiled_runs().groupby("artifact").size().tolist() == [6, 6]
        # the timed samples are the timed runs alone
        assert all(len(x) >= 5 for x in store.to_dataframe()["latency_ms"])
    html_path, md_path = write_report(results, ws)
    md = md_path.read_text()
    assert "## Per layer: where compaction's time goes" in md
    assert "### digits-cnn-layers/client-000 — local, onnx/fp32, 1 thread(s)" in md
    table = md.split("### digits-cnn-layers/client-000", 1)[1]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ")}
    # units kept and FLOP ratio: conv1 16 -> 2 filters (8×), conv2 reads 2 of 16 channels (8×), out unchanged
    assert rows["conv1"][:2] == ["2/16", "8.00×"] and rows["conv2"][:2] == ["32/32", "8.00×"]
    assert rows["out"][:2] == ["10/10", "1.00×"]
    for layer in ("conv1", "conv2", "out"):
        assert rows[layer][2] not in ("", "—") and rows[layer][3] not in ("", "—")  # dense and compacted ms
    assert " / " in rows["sum of operators / end to end"][2]
    assert (results / "plots" / "layer_time.png").is_file()
    assert "Where the time goes" in html_path.read_text()
