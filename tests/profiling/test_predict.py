"""The sampled campaign's predictor (profiling/predict.py): exact on a synthetic per-layer model, the sample spans
the kept units, and a predicted value is never labelled measured (results.parquet, the report)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from edgemask.profiling.predict import ClientLayers, choose_sample, error_summary, fit, leave_one_out, HeldOut

# three layers of a fixed architecture: out units, kernel; layer l reads layer l-1's kept units (the first: 16)
SHAPES = {"conv1": (32, 9), "conv2": (64, 9), "fc": (10, 1)}
COEF = {"conv1": (0.05, 2e-6, 1e-3), "conv2": (0.08, 3e-6, 4e-4), "fc": (0.01, 1e-6, 0.0)}  # a + b·F + c·k, ms
FIXED = 0.123


def synthetic(name: str, kept: dict[str, int], measured: bool = True) -> ClientLayers:
    flops, prev = {}, 16
    for layer, (_, kernel) in SHAPES.items():
        flops[layer] = 2 * kept[layer] * prev * kernel
        prev = kept[layer]
    ms = {l: COEF[l][0] + COEF[l][1] * flops[l] + COEF[l][2] * kept[l] for l in SHAPES}
    if not measured:
        return ClientLayers(name, kept, flops)
    return ClientLayers(name, kept, flops, ms, FIXED + sum(ms.values()))


def clients(n: int, seed: int = 0) -> list[ClientLayers]:
    rng = np.random.default_rng(seed)
    return [synthetic(f"run/client-{i:03d}", {"conv1": int(rng.integers(3, 33)), "conv2": int(rng.integers(4, 65)),
                                              "fc": 10}) for i in range(n)]


def test_exact_per_layer_model_is_recovered_and_predicts_exactly():
    train, held = clients(6), clients(4, seed=1)
    model = fit(train)
    assert model.fixed_ms == pytest.approx(FIXED, abs=1e-9)
    for c in held:
        want = FIXED + sum(c.layer_ms.values())
        assert model.predict(ClientLayers(c.artifact, c.kept, c.flops)) == pytest.approx(want, rel=1e-9)
        for layer, t in model.layer_ms(c).items():
            assert t == pytest.approx(c.layer_ms[layer], rel=1e-9, abs=1e-12)
    loo = leave_one_out(train)
    assert len(loo) == 6 and max(abs(h.error) for h in loo) < 1e-9
    assert error_summary(loo) == {"n": 6, "within_10": 1.0, "within_5": 1.0, "worst": pytest.approx(0, abs=1e-9)}


def test_without_the_fixed_cost_the_prediction_would_be_short_by_it():
    # the fixed per-inference cost is part of the prediction: the sum of layer times alone misses FIXED
    train = clients(6)
    c = clients(1, seed=3)[0]
    model = fit(train)
    assert model.predict(c) - sum(model.layer_ms(c).values()) == pytest.approx(FIXED)


def test_error_summary_counts_by_hand():
    held = [HeldOut("a", 10.0, 10.4), HeldOut("b", 10.0, 10.7), HeldOut("c", 10.0, 8.0), HeldOut("d", 10.0, 9.5)]
    # errors +4 %, +7 %, −20 %, −5 %: within ±10 %: 3 of 4; within ±5 %: 2 of 4 (±5 % itself counts); worst 20 %
    s = error_summary(held)
    assert s["n"] == 4 and s["within_10"] == 0.75 and s["within_5"] == 0.5 and s["worst"] == pytest.approx(0.2)


def test_sample_spans_the_kept_units_and_follows_its_seed():
    kept = {f"c{i:02d}": 100 + 7 * ((i * 5) % 13) for i in range(13)}  # 13 distinct totals, shuffled order
    lo, hi = min(kept, key=kept.get), max(kept, key=kept.get)
    a = choose_sample(kept, 4, seed=1)
    assert len(set(a)) == 4 and lo in a and hi in a
    assert choose_sample(kept, 4, seed=1) == a  # the seed makes it repeatable
    assert {tuple(choose_sample(kept, 4, seed=s)) for s in range(10)} != {tuple(a)}  # and it is a draw
    # one per consecutive group of the sorted totals: groups of 4, 3, 3, 3 -> ranks 0 | 4..6 | 7..9 | 12
    ranks = sorted(sorted(kept, key=kept.get).index(x) for x in a)
    assert ranks[0] == 0 and 4 <= ranks[1] <= 6 and 7 <= ranks[2] <= 9 and ranks[3] == 12
    assert choose_sample(kept, 20, seed=0) == sorted(kept)


@pytest.mark.slow
def test_a_sampled_campaign_marks_predicted_rows_and_never_counts_them_measured(tmp_path):
    from edgemask.export import export_run
    from edgemask.profiling.campaign import parse_campaign, plan_campaign, run_campaign
    from edgemask.profiling.report import write_report
    from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
    from edgemask.trainer.data import DataConfig
    from edgemask.trainer.models import build_model, model_sites
    from edgemask.trainer.models.masking import all_ones_masks
    from edgemask.trainer.run_dir import ClientState, write_run

    ws = tmp_path / "ws"
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-mlp-sample"), data=DataConfig(name="digits",
                      num_clients=5), model=ModelConfig("mlp", {"hidden": [256, 128]}),
                      algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(256, 128))
    states = {}
    for i, keep in enumerate((0.1, 0.3, 0.5, 0.7, 0.9)):  # client-00i keeps this share of both hidden layers
        masks = all_ones_masks(model, tuple(s for s in model_sites(model) if s.name != "out"))
        masks["fc1.weight"][round(keep * 256):] = 0
        masks["fc2.weight"][round(keep * 128):] = 0
        states[f"client-00{i}"] = ClientState(masks=masks)
    write_run(ws / "runs" / cfg.run.run_id, cfg, model.state_dict(), states, [], {"run_id": cfg.run.run_id,
                                                                                  "clients": {}})
    export_run(ws / "runs" / cfg.run.run_id, ws / "artifacts", formats=("onnx",), progress=False)
    camp = parse_campaign({
        "campaign": {"name": "sampled", "formats": ["onnx"], "devices": ["local"], "threads": [1], "retries": 0,
                     "sample_clients": 3, "sample_seed": 7},
        "artifacts": [{"run": cfg.run.run_id, "clients": "all", "dense": True}],
        "runner": {"warmup_runs": 2, "warmup_seconds": 0.0, "min_runs": 20, "min_seconds": 0.05,
                   "idle_seconds": 0.0, "profile_layers": True, "profile_runs": 5, "profile_warmup": 2}})
    plan = plan_campaign(camp, ws)
    measured = sorted({j.artifact for j in plan.jobs})
    # the extremes of the kept range (client-000 keeps 10 %, client-004 90 %) are always measured
    assert {"digits-mlp-sample/dense", "digits-mlp-sample/client-000", "digits-mlp-sample/client-004"} \
        <= set(measured) and len(measured) == 4
    assert len(plan.artifacts) == 6  # every client stays in the plan's artifacts, to be predicted
    run_campaign(camp, ws, progress=False)
    results = camp.results_dir(ws)
    _, md_path = write_report(results, ws)
    df = pd.read_parquet(results / "results.parquet")
    pred, meas = df[df["predicted"]], df[~df["predicted"]]
    assert sorted(meas["artifact"]) == measured
    assert len(pred) == 2 and not set(pred["artifact"]) & set(measured)
    assert (pred["verdict"] == "PREDICTED").all() and not pred["valid"].any() and not pred["comparison_valid"].any()
    assert pred["p50_ms"].notna().all() and (pred["p50_ms"] > 0).all()
    assert set(meas["verdict"]) <= {"VALID", "INVALID"}
    # the file each prediction is about, by its digest in the manifest
    for r in pred.itertuples():
        from edgemask.manifest import load_manifest

        assert r.artifact_sha256 == load_manifest(ws / "artifacts" / r.artifact).file_for("onnx", "fp32").sha256
    md = md_path.read_text()
    head = md.split("## ", 1)[0]
    assert "PREDICTED" not in head  # the headline counts measured settings only
    section = md.split("## Predicted, not measured", 1)[1]
    for a in pred["artifact"]:
        assert a in section and a not in md.split("## Predicted, not measured", 1)[0].split("## Every artifact")[1]
    assert "held-out (leave-one-out) error" in section and "≈" in section
    assert (results / "plots" / "predicted.png").is_file()
