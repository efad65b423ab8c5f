"""What a client's local training costs on a board, measured (issue #39): the training rows of a campaign.

A campaign that names a training format (``pte-train``: ExecuTorch's joint forward-backward program; ``torch-train``:
the step as a torch.export program for torch on the board) measures, per client artifact, device and threads, one
local step (forward + backward + SGD update on ``batch_size`` samples) per latency sample and whole local rounds
(``steps_per_round`` = ⌈num_train ÷ batch⌉ · epochs steps) back to back. ``profiling.stats.summarize`` gives each such
setting a row with ``workload`` ``train`` and the columns of :data:`edgemask.profiling.stats.TRAINING_COLUMNS`.

Here:

- :func:`training_costs`: the public table other code sets budgets from, one row per run × client × device ×
  format × threads (× model file digest, where a setting was measured from two files), read from a campaign's store
  with the campaign's own verdict rules;
- :func:`local_rounds`: per artifact × device × threads, the one training row the ledger, the device traces and the
  replay take, by a named preference of training formats (:data:`DEFAULT_TRAIN_FORMAT` ``torch-train`` first when
  both are measured: it runs torch's own kernels, where the ExecuTorch step runs portable ones and is ~12× slower on
  the demo MLP; ``train_format`` names the other), and the samples its measured round stands for
  (:func:`round_samples`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.targets import TRAINING_FORMATS
from edgemask.profiling.stats import TRAIN, summarize
from edgemask.profiling.store import ResultsStore
from edgemask.profiling.verdict import VerdictRules

# The training format whose measured round stands for a client's local round where several were measured
DEFAULT_TRAIN_FORMAT = "torch-train"
# training_costs' columns, in order
COST_COLUMNS = ["run_id", "client_id", "device", "format", "variant", "threads", "artifact", "artifact_sha256",
                "step_p50_ms", "steps_per_round", "batch_size", "num_train", "epochs", "local_round_ms",
                "local_rounds", "local_round_pred_ms", "step_energy_mj", "local_round_energy_mj", "trained_params",
                "verdict", "valid"]
# local_rounds' columns (besides its keys artifact, device, threads)
ROUND_COLUMNS = ["local_round_ms", "local_round_format", "local_round_verdict", "local_round_sha256",
                 "round_samples", "step_p50_ms", "steps_per_round", "batch_size", "step_energy_mj"]


def training_costs(results_dir: str | Path) -> pd.DataFrame:
    """The measured local training of every client in the campaign at ``results_dir`` (``results/<campaign>/``):
    one row per run_id × client_id × device × format × threads (a setting measured from two model files, possible
    only in an old store, has one row per file) with ``step_p50_ms`` (p50 of the timed steps), ``steps_per_round``
    and ``batch_size`` (the round the step belongs to), ``num_train`` and ``epochs``, ``local_round_ms`` (median of
    the measured whole rounds; NaN where none was timed) over ``local_rounds`` rounds, ``local_round_pred_ms`` (step
    p50 × steps_per_round), energy per step and per round (NaN without a power sensor), ``trained_params``,
    ``verdict`` / ``valid`` (the campaign's training rules, :meth:`VerdictRules.for_training`) and
    ``artifact_sha256`` (the training file measured). Read from ``results.sqlite`` (no report needed); an empty
    frame with these columns when the campaign measured no training format."""
    path = Path(results_dir) / "results.sqlite"
    if not path.is_file():
        raise CorruptFileError(f"{path}: no results store; run `edgemask profile` first")
    with ResultsStore.open(path) as store:
        df, config = store.to_dataframe(), store.campaign_config() or {}
    df = df[df["format"].isin(TRAINING_FORMATS)]
    if df.empty:
        return pd.DataFrame(columns=COST_COLUMNS)
    from edgemask.profiling.provenance import finite_samples

    finite_samples(df, str(path))  # a NaN or inf step would pass into a p50 unseen (issue #44)
    summary = summarize(df, training_rules=VerdictRules.for_training(config))
    out = summary[summary["workload"] == TRAIN]
    return out[COST_COLUMNS].sort_values(["run_id", "client_id", "device", "format", "threads"]).reset_index(drop=True)


def round_samples(num_train: float, epochs: float, steps_per_round: float, batch_size: float) -> float:
    """The training samples one measured local round stands for: the client's ``num_train`` × ``epochs`` (its
    last batch of each epoch as the host ran it, part full), or ``steps_per_round`` × ``batch_size`` where the round
    was capped below that (an algorithm's ``max_steps``), or the latter where the manifest's numbers are missing."""
    full = steps_per_round * batch_size
    if _known(num_train) and _known(epochs):
        return float(min(num_train * epochs, full)) if _known(full) else float(num_train * epochs)
    return float(full)


def _known(x: object) -> bool:
    try:
        return not math.isnan(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def local_rounds(results: pd.DataFrame, train_format: str = DEFAULT_TRAIN_FORMAT) -> pd.DataFrame:
    """Per artifact × device × threads of ``results`` (``results.parquet``'s frame), the training row whose
    measured round stands for the artifact's local round: of the rows with a measured ``local_round_ms``,
    ``train_format``'s, else the first of :data:`edgemask.targets.TRAINING_FORMATS` measured. Columns: the keys,
    ``local_round_ms``, ``local_round_format``, ``local_round_verdict``, ``local_round_sha256`` (the training file),
    ``round_samples`` (:func:`round_samples`), ``step_p50_ms``, ``steps_per_round``, ``batch_size``,
    ``step_energy_mj``. Empty (with these columns) where nothing was measured."""
    if train_format not in TRAINING_FORMATS:
        raise ConfigError(f"training format {train_format!r}: expected one of {', '.join(TRAINING_FORMATS)}")
    keys = ["artifact", "device", "threads"]
    empty = pd.DataFrame(columns=[*keys, *ROUND_COLUMNS]).astype({"threads": int, "local_round_ms": float,
                                                                  "round_samples": float})
    if results.empty or "workload" not in results.columns or "local_round_ms" not in results.columns:
        return empty
    t = results[(results["workload"] == TRAIN) & pd.to_numeric(results["local_round_ms"], errors="coerce").notna()]
    if "predicted" in t.columns:
        t = t[~t["predicted"].fillna(False).astype(bool)]
    if t.empty:
        return empty
    order = [train_format, *(f for f in TRAINING_FORMATS if f != train_format)]
    t = t.assign(_rank=t["format"].map({f: i for i, f in enumerate(order)}))
    t = t.sort_values([*keys, "_rank"], kind="stable").drop_duplicates(keys, keep="first")
    out = pd.DataFrame({
        "artifact": t["artifact"].astype(str), "device": t["device"].astype(str), "threads": t["threads"].astype(int),
        "local_round_ms": t["local_round_ms"].astype(float), "local_round_format": t["format"].astype(str),
        "local_round_verdict": t["verdict"], "local_round_sha256": t.get("artifact_sha256"),
        "round_samples": [round_samples(*(_float(r, c) for c in ("num_train", "epochs", "steps_per_round",
                                                                  "batch_size")))
                          for _, r in t.iterrows()],
        "step_p50_ms": t["step_p50_ms"].astype(float), "steps_per_round": t["steps_per_round"].astype(float),
        "batch_size": t["batch_size"].astype(float), "step_energy_mj": t["step_energy_mj"].astype(float)})
    return out.reset_index(drop=True)


def _float(row: pd.Series, col: str) -> float:
    v = row.get(col)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# FedScale's augmentation factor, the 3× assumption a measured round is set beside (profiling.replay uses the same)
ASSUMED_FACTOR = 3.0


def training_table(results: pd.DataFrame, train_model: str = "dense") -> pd.DataFrame:
    """The report's training table: per training row (client × board × training format × threads) and per
    inference setting measured on the same device and threads, the measured step and local round beside what the
    3× assumption would cost the same round: ``assumed_round_ms`` = 3 × the round's samples (:func:`round_samples`)
    × the batch-1 inference p50 of the model trained (``train_model`` ``dense``: the run's dense artifact in that
    inference setting, as ``profiling.trace`` writes ``computation_ms``; ``compacted``: the client's own), and
    ``measured_over_assumed`` = local_round_ms ÷ assumed_round_ms. Training rows with no such inference setting
    keep one row with the assumption missing."""
    cols = ["artifact", "device", "threads", "format", "step_p50_ms", "steps_per_round", "round_samples",
            "local_round_ms", "local_round_pred_ms", "assumed_from", "assumed_round_ms", "measured_over_assumed",
            "verdict", "assumed_verdict"]
    if results.empty or "workload" not in results.columns:
        return pd.DataFrame(columns=cols)
    train = results[results["workload"] == TRAIN]
    infer = results[results["workload"] != TRAIN]
    if "predicted" in infer.columns:
        infer = infer[~infer["predicted"].fillna(False).astype(bool)]
    rows = []
    for t in train.sort_values(["device", "threads", "artifact", "format"]).itertuples():
        samples = round_samples(*(_float(pd.Series(t._asdict()), c)
                                  for c in ("num_train", "epochs", "steps_per_round", "batch_size")))
        base = {"artifact": t.artifact, "device": t.device, "threads": int(t.threads), "format": t.format,
                "step_p50_ms": float(t.step_p50_ms), "steps_per_round": float(t.steps_per_round),
                "round_samples": samples, "local_round_ms": float(t.local_round_ms),
                "local_round_pred_ms": float(t.local_round_pred_ms), "verdict": t.verdict}
        model = f"{t.run_id}/dense" if train_model == "dense" else t.artifact
        same = infer[(infer["device"] == t.device) & (infer["threads"] == t.threads) & (infer["artifact"] == model)]
        if same.empty:
            rows.append({**base, "assumed_from": None, "assumed_round_ms": math.nan,
                         "measured_over_assumed": math.nan, "assumed_verdict": None})
        for i in same.sort_values(["format", "variant"]).itertuples():
            assumed = ASSUMED_FACTOR * samples * float(i.p50_ms)
            rows.append({**base, "assumed_from": f"{i.artifact} {i.format}/{i.variant}",
                         "assumed_round_ms": assumed,
                         "measured_over_assumed": float(t.local_round_ms) / assumed if assumed else math.nan,
                         "assumed_verdict": i.verdict})
    return pd.DataFrame(rows, columns=cols)
