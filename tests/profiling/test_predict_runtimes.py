"""The sampled campaign's predictor on every runtime with per-layer times, read back from a real results store:
``.pte`` clients (ExecuTorch's ETDump events, named after their layers by ``attach_etdump``) are predicted like
ONNX ones, and a setting whose layers cannot be timed says why in one line instead of showing 0 predicted."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from edgemask.devices.inventory import FORMAT_RUNTIME
from edgemask.devices.records import Measurement
from edgemask.fileio import sha256_file
from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, write_manifest, write_sample_io
from edgemask.profiling.campaign import parse_campaign, plan_campaign
from edgemask.profiling.predict import PREDICTED, error_lines, predicted_rows
from edgemask.profiling.stats import summarize
from edgemask.profiling.store import ResultsStore

RUN = "run-p"
IN, DENSE = 16, {"fc1": 32, "fc2": 16, "out": 10}
COEF = {"fc1": (0.004, 1.0e-6), "fc2": (0.006, 2.0e-6), "out": (0.002, 1.5e-6)}  # per layer: ms + ms per FLOP
FIXED_MS = 0.05
FORMATS = ("onnx", "pte", "tflite")
NO_ETRECORD = ("no ETRecord beside the .pte: ExecuTorch operator events cannot be mapped to layers; re-export the "
               "artifact with this edgemask")


def flops(kept: dict[str, int]) -> dict[str, int]:
    return {"fc1": 2 * IN * kept["fc1"], "fc2": 2 * kept["fc1"] * kept["fc2"], "out": 2 * kept["fc2"] * 10}


def layer_ms(kept: dict[str, int]) -> dict[str, float]:
    return {n: COEF[n][0] + COEF[n][1] * f for n, f in flops(kept).items()}


def true_ms(kept: dict[str, int]) -> float:
    return FIXED_MS + sum(layer_ms(kept).values())


def _artifact(ws, client: str, kept: dict[str, int]) -> None:
    d = ws / "artifacts" / RUN / client
    d.mkdir(parents=True)
    files = []
    for fmt in FORMATS:
        path = d / f"model.fp32.{fmt}"
        path.write_bytes(f"{client}/{fmt}".encode())  # stand-ins: nothing runs them
        files.append(ArtifactFile(format=fmt, variant="fp32", file=path.name, sha256=sha256_file(path),
                                  bytes=path.stat().st_size, runtime=FORMAT_RUNTIME[fmt]))
    fd, fc = flops(DENSE), flops(kept)
    layers = [{"name": n, "kept": kept[n], "total": DENSE[n], "flops_dense": fd[n], "flops_compacted": fc[n],
               "graph_names": {"model.fp32.onnx": [f"/{n}/Gemm"]}} for n in DENSE]  # ONNX names only, as export
    write_sample_io(d / SAMPLE_IO, np.zeros((2, IN), np.float32), np.zeros((2, 10), np.float32), np.zeros(2, np.int64))
    write_manifest(d, Manifest(
        run_id=RUN, client_id=client, kind="dense" if client == "dense" else "compacted", algorithm="fedmask",
        model="mlp", dataset="digits", inputs=[TensorSpec("input", [1, IN], "float32")],
        outputs=[TensorSpec("output", [1, 10], "float32")], files=files,
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(d / SAMPLE_IO), "count": 2},
        params={"dense": 1000, "compacted": 500}, flops={"dense": sum(fd.values()), "compacted": sum(fc.values())},
        layers=layers, tolerance={"limit": 1e-5, "rtol": 0.0, "max_abs_diff": {}}, created="2026-12-01T10:00:00Z"))


def _profile(fmt: str, device: str, kept: dict[str, int], p50: float) -> dict:
    """What the worker stores: onnxruntime's events by graph name; ExecuTorch's as ``attach_etdump`` leaves them
    (each mapped XNNPACK event named after its layer; without an ETRecord, the runtime's own names and a note);
    LiteRT: no per-operator events."""
    if fmt == "tflite":
        return {"available": False, "reason": "the tflite runtime has no per-operator profiler", "runs": [],
                "blocks": []}
    per = layer_ms(kept)
    if fmt == "onnx":
        ops = [[f"/{n}/Gemm", "Gemm", 1e3 * t, "CPUExecutionProvider"] for n, t in per.items()]
    elif device == "dev-a":
        ops = [[n, f"Fully Connected (NC, F32) GEMM #{i + 1}", 1e3 * t, "XnnpackBackend"]
               for i, (n, t) in enumerate(per.items())]
    else:
        ops = [[f"Fully Connected (NC, F32) GEMM #{i + 1}", f"Fully Connected (NC, F32) GEMM #{i + 1}", 1e3 * t,
                "XnnpackBackend"] for i, t in enumerate(per.values())]
    blocks = [NO_ETRECORD] if fmt == "pte" and device == "dev-b" else []
    return {"available": True, "profiler": "test", "blocks": blocks,
            "runs": [{"end_to_end_ms": p50, "total_us": 1e3 * p50, "ops": ops} for _ in range(3)]}


@pytest.fixture(scope="module")
def store_data(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    rng = np.random.default_rng(0)
    kept = {"dense": dict(DENSE)}
    kept.update({f"client-{i:03d}": {"fc1": int(rng.integers(4, 33)), "fc2": int(rng.integers(2, 17)), "out": 10}
                 for i in range(10)})
    for client, k in kept.items():
        _artifact(ws, client, k)
    cfg = parse_campaign({
        "campaign": {"name": "sampled", "formats": list(FORMATS), "devices": ["dev-a", "dev-b"], "threads": [1],
                     "repetitions": 1, "retries": 0, "sample_clients": 5, "sample_seed": 3},
        "artifacts": [{"run": RUN, "clients": "all", "dense": True}],
        "runner": {"min_runs": 5, "min_seconds": 0.01, "profile_layers": True, "profile_runs": 3}})
    plan = plan_campaign(cfg, ws)
    with ResultsStore.open(ws / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(plan.artifacts.values())
        for job in plan.jobs:
            k = kept[job.artifact.split("/")[1]]
            p50 = true_ms(k)
            store.record(job, Measurement(
                device=job.device, artifact=job.artifact, format=job.format, variant=job.variant, threads=job.threads,
                ok=True, latency_ms=(p50,) * 5, load_ms=1.0, first_inference_ms=1.0, peak_rss_kb=1000,
                rss_growth_kb=100, output_max_abs_diff=0.0, output_check_passed=True, timed_window_s=1.0,
                artifact_sha256=plan.artifacts[job.artifact].file_for(job.format, job.variant).sha256,
                profile=_profile(job.format, job.device, k, p50)))
        data = (store.artifacts(), store.profiles(), store.profiled_runs(), store.operator_samples())
        summary = summarize(store.to_dataframe())
    measured = {j.artifact for j in plan.jobs}
    return summary, data, kept, measured


def test_pte_clients_with_etdump_layer_times_are_predicted_like_onnx(store_data):
    summary, data, kept, measured = store_data
    pred, errors = predicted_rows(summary, *data)
    assert len(measured) == 6  # the dense baseline and 5 of the 10 clients; 5 left to predict
    for fmt in ("pte", "onnx"):
        rows = pred[(pred["device"] == "dev-a") & (pred["format"] == fmt)]
        assert sorted(rows["artifact"]) == sorted(f"{RUN}/{c}" for c in kept if f"{RUN}/{c}" not in measured)
        assert rows["predicted"].all() and (rows["verdict"] == PREDICTED).all() and not rows["valid"].any()
        # the per-layer model is exact here: each prediction is the client's true latency
        for r in rows.itertuples():
            assert r.p50_ms == pytest.approx(true_ms(kept[r.client_id]), rel=1e-6)
        err = errors[(errors["device"] == "dev-a") & (errors["format"] == fmt)].iloc[0]
        assert (err["measured"], err["predicted"], err["loo_n"]) == (6, 5, 6)
        assert err["loo_within_10"] == 1.0 and err["loo_worst"] < 1e-6 and pd.isna(err.get("reason"))
    lines = error_lines(errors)
    assert f"{RUN} on dev-a, pte/fp32, 1 thread(s): 6 measured, 5 predicted; held-out (leave-one-out) error: " \
           "100 % within ±10 %, 100 % within ±5 %, worst 0.0 %" in lines


def test_settings_without_layer_times_say_why_in_one_line(store_data):
    summary, data, _, _ = store_data
    pred, errors = predicted_rows(summary, *data)
    # a .pte profiled without its ETRecord (no event maps to a layer) and LiteRT (no per-operator events)
    assert pred[(pred["device"] == "dev-b") & (pred["format"] == "pte")].empty
    assert pred[pred["format"] == "tflite"].empty
    lines = error_lines(errors)
    assert f"{RUN} on dev-b, pte/fp32, 1 thread(s): 6 measured, 5 not predicted: no profiled operator event was " \
           f"mapped to a layer ({NO_ETRECORD})" in lines
    for device in ("dev-a", "dev-b"):
        assert f"{RUN} on {device}, tflite/fp32, 1 thread(s): 6 measured, 5 not predicted: per-layer times not " \
               "available: the tflite runtime has no per-operator profiler" in lines
    assert len(lines) == len(errors) == 6  # onnx ×2, pte ×2, tflite ×2: every setting has its line
    assert json.loads(data[0]["manifest"].iloc[0])["layers"][0]["graph_names"].keys() == {"model.fp32.onnx"}
