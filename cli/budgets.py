"""``edgemask budgets``: PerFedMask's ψ_n from a campaign's measured training steps (:mod:`edgemask.profiling.budgets`)
written into a new training config, with where each came from."""

from __future__ import annotations

import tomllib
from pathlib import Path

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.fileio import sha256_file, write_text_atomic
from edgemask.tomlio import dumps_toml, read_toml

# --cost-model: how a board's step cost is modelled (docs/fedmask.md, "PerFedMask's budgets from the boards")
COST_MODELS = ("line", "layers")


def write_budgets(config: Path, results: Path, mix: dict[str, float], deadline_s: float, out: Path,
                  fmt: str = "torch-train", threads: int = 1, measured_run: str | None = None,
                  run_id: str | None = None, allow_invalid: bool = False,
                  workspace: Path | None = None, cost_model: str = "line") -> dict[str, dict]:
    """Read the PerFedMask training config ``config``, fit each board's step cost to the VALID ``fmt`` rows of
    ``measured_run`` (default: the config's run id) in ``results``, set every device's budget for the
    ``deadline_s`` local round, and write the config with ``budgets`` and ``budget_source`` to ``out`` (run id
    ``run_id``, default ``<run id>-measured``). ``allow_invalid``: fit INVALID rows too (a stand-in's noisy
    steps), recorded in ``budget_source`` as resting on them. Returns the per-device records.

    Before any fit (issue #44, docs/contracts.md "Provenance of derived numbers"): the rows must be of the model
    ``config`` trains (the measured run's manifests: model, data set, dense parameter count), and where
    ``workspace`` (default: the one ``results`` sits in, ``<workspace>/results/<campaign>``) holds
    ``runs/<measured_run>/``, that run must be the one the campaign measured (its digests, its summary's model)
    with the config's ``[model]``; each mismatch is one line naming both sides, and nothing is written.
    ``budget_source.inputs`` records the digests of what the budgets rest on.

    ``cost_model`` (docs/fedmask.md, "PerFedMask's budgets from the boards"): ``line``, a step's time as a line in
    the trained fraction f (:mod:`edgemask.profiling.budgets`); ``layers``, the per-layer model of the step
    (:mod:`edgemask.profiling.train_predict`, fitted on the rows' profiled steps), each device's round predicted on
    the layers P^mask gives it, its budget lowered until that round meets the deadline."""
    from edgemask import values
    from edgemask.mix import assign_boards
    from edgemask.profiling.provenance import RunIdentity, check_same, finite_column, from_run_dir, from_store
    from edgemask.profiling.store import ResultsStore
    from edgemask.profiling.training import training_costs
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.data import build_dataset
    from edgemask.trainer.models import build_model, head_names

    deadline_s = values.seconds("--deadline", deadline_s)
    if cost_model not in COST_MODELS:
        raise ConfigError(f"--cost-model {cost_model!r}: expected one of {', '.join(COST_MODELS)}")
    cfg = TrainConfig.load(config)
    if cfg.algorithm.name != "perfedmask":
        raise ConfigError(f"{config}: [algorithm] name is {cfg.algorithm.name!r}; budgets are PerFedMask's ψ_n")
    values.output_file("--out", out, {"--config": Path(config), "--results": Path(results)})  # the CLI's one check
    measured_run = measured_run or cfg.run_id
    store = Path(results) / "results.sqlite"
    if not store.is_file():
        raise CorruptFileError(f"{store}: no results store; run `edgemask profile` first")
    with ResultsStore.open(store) as s:
        artifacts, recorded = s.artifacts(), s.runs()
    measured = from_store(artifacts, recorded, measured_run, f"--results {results}")
    if measured is None:
        have = ", ".join(sorted(set(artifacts["run_id"]))) or "none"
        raise ConfigError(f"--results {results}: no artifact of run {measured_run} was measured there (runs "
                          f"measured: {have}); --config {config} describes run {cfg.run_id}: give --measured-run, "
                          f"or measure run {measured_run}'s training artifacts")
    ds = build_dataset(cfg.data, cfg.run.seed)
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes, **cfg.model.args)
    check_same(RunIdentity(measured_run, f"--config {config}", cfg.model.name, cfg.data.name,
                           sum(p.numel() for p in model.parameters())), measured,
               f"budgets are fitted to the steps of the model the config trains: give the config run {measured_run} "
               f"was trained with, or measure a run of this config")
    workspace = Path(workspace) if workspace is not None else (
        Path(results).parent.parent if Path(results).resolve().parent.name == "results" else None)
    run_dir = workspace / "runs" / measured_run if workspace is not None else None
    run = from_run_dir(run_dir) if run_dir is not None else None
    if run is not None:
        check_same(run, measured, f"the run was re-trained since the campaign measured it: measure its "
                                  f"artifacts again (export, then a campaign under a new name)")
        run_cfg = TrainConfig.from_dict(tomllib.loads(_checked_text(run_dir, "config.toml")),
                                        str(run_dir / "config.toml"))
        if run_cfg.model != cfg.model:
            raise ConfigError(f"--config {config}: [model] {_model_text(cfg.model)}; but {run_dir / 'config.toml'}: "
                              f"[model] {_model_text(run_cfg.model)} — not the model run {measured_run} trained; "
                              f"give its config, or measure a run of this one")
        measured = measured.merged(run)
    head = set(head_names(model))
    d_w = sum(p.numel() for n, p in model.named_parameters() if n not in head)
    rows = training_costs(results)
    rows = rows[(rows["run_id"] == measured_run) & (rows["format"] == fmt) & (rows["threads"] == threads)]
    valid = rows if allow_invalid else rows[rows["verdict"] == "VALID"]
    if valid.empty:
        raise ConfigError(f"{results}: no VALID {fmt} rows of run {measured_run} at {threads} thread(s); measure its "
                          f"training artifacts first (a campaign with formats = [\"{fmt}\"])")
    for col in ("step_p50_ms", "trained_params"):  # a NaN or inf here would fit a line through nothing
        finite_column(valid, col, str(store), lambda r: f"{r['artifact']} {fmt} on {r['device']}", positive=True,
                      missing_ok=False)
    steps = round_steps(cfg, ds)
    boards = assign_boards(list(steps), mix, cfg.run.seed)
    if cost_model == "layers":
        devices, source = _layer_budgets(cfg, model, head, results, store, fmt, threads, measured_run, deadline_s,
                                         mix, steps, boards, allow_invalid)
    else:
        devices, source = _line_budgets(valid, d_w, results, store, fmt, threads, measured_run, deadline_s, mix,
                                        steps, boards)
    source["inputs"] = {
        "config": {"path": str(config), "sha256": sha256_file(config)},
        "results_sqlite": sha256_file(store),
        "measured_run": measured.to_dict() | {"run_dir": "found" if run is not None else "not in the workspace"},
        "rows": {f"{r.artifact} {r.format} on {r.device}": r.artifact_sha256 or "unknown"
                 for r in valid.itertuples()}}
    data = read_toml(config)
    data.setdefault("run", {})["run_id"] = run_id or f"{cfg.run_id}-measured"
    args = data.setdefault("algorithm", {}).setdefault("args", {})
    args["budgets"] = [devices[c]["fraction"] for c in steps]
    if allow_invalid:
        invalid = sorted(set(valid.loc[valid["verdict"] != "VALID", "device"]))
        source["invalid_rows_on"] = invalid  # --allow-invalid: these boards' fits rest on INVALID rows
    args["budget_source"] = source
    text = (f"# Written by `edgemask budgets` from {config}: PerFedMask's budgets psi_n / d_w from the {fmt} steps "
            f"measured in {results}\n# (deadline {deadline_s:g} s per local round, cost model {cost_model}; "
            f"algorithm.args.budget_source says how each was set).\n" + dumps_toml(data))
    TrainConfig.from_dict(data, str(out))  # what is written reads back as a training config
    write_text_atomic(out, text)
    return devices


def round_steps(cfg, ds) -> dict[str, int]:
    """Each device's local steps a round as the host trains them: ``local_epochs`` epochs of
    :func:`~edgemask.trainer.sampling.epoch_steps` (``one_sample_batch``'s decision for this config and data), at
    least one step an epoch."""
    from edgemask.trainer.algorithms.base import one_sample_rule
    from edgemask.trainer.sampling import epoch_steps

    B, E, drop = cfg.training.batch_size, cfg.training.local_epochs, one_sample_rule(cfg, ds)
    return {c.client_id: max(1, epoch_steps(len(c.train_y), B, drop)) * E for c in ds.clients}


def _line_budgets(valid, d_w, results, store, fmt, threads, measured_run, deadline_s, mix, steps, boards):
    """``--cost-model line``: per board a line in the trained fraction f; the budgets and ``budget_source``."""
    from edgemask.profiling.budgets import budgets_from_costs, fit_board_costs, source_record

    costs = fit_board_costs(valid, d_w)
    missing = sorted(set(mix) - set(costs))
    if missing:
        raise ConfigError(f"--mix: no VALID {fmt} rows measured on {', '.join(missing)} in {results}; boards measured: "
                          f"{', '.join(sorted(costs))}")
    devices = budgets_from_costs(steps, boards, costs, deadline_s)
    return devices, source_record(str(results), sha256_file(store), fmt, threads, measured_run, deadline_s, mix,
                                  costs, devices)


def _layer_budgets(cfg, model, head, results, store, fmt, threads, measured_run, deadline_s, mix, steps, boards,
                   allow_invalid):
    """``--cost-model layers``: per board the per-layer model fitted on its profiled steps, the budgets P^mask's
    layers afford (:func:`edgemask.profiling.train_predict.layer_budgets`) and ``budget_source``."""
    from edgemask.profiling.train_predict import (error_summary, fit, layer_budgets, leave_one_out, model_record,
                                                  store_clients)
    from edgemask.trainer.algorithms.base import parse_args
    from edgemask.trainer.algorithms.perfedmask import PerFedMask, layer_groups, solve_pmask

    per_board = store_clients(results, measured_run, fmt, threads, allow_invalid)
    models, held = {}, {}
    for board in sorted(mix):
        clients = per_board.get(board, [])
        if not any(c.measured for c in clients):
            raise ConfigError(f"--cost-model layers: no {fmt} row of run {measured_run} on board {board} in {results} "
                              f"has profiled steps; measure them with [training_runner] profile_layers = true, or "
                              f"give --cost-model line")
        models[board] = fit(clients)
        held[board] = {k: v for k, v in error_summary(leave_one_out(clients)).items() if v == v}  # no NaN in TOML
    params = dict(model.named_parameters())
    groups = layer_groups([n for n in params if n not in head])  # Λ, as PerFedMask's set-up groups them
    sizes = [sum(params[k].numel() for k in ps) for ps in groups.values()]
    args = parse_args(PerFedMask.Args, cfg.algorithm.args, cfg.algorithm.name)
    printed = args.objective == "printed"

    def solve(psi):
        return solve_pmask(sizes, psi, args.milp_time_limit, printed=printed).masks.tolist()

    devices, rounds = layer_budgets(steps, boards, models, groups, sizes, deadline_s, solve)
    source = {"results": str(results), "results_sha256": sha256_file(store), "format": fmt, "threads": threads,
              "measured_run": measured_run, "deadline_s": deadline_s, "mix": dict(mix),
              "model": "per layer: step = C + sum_l t(l, trained, gradient through) + U(trained params), round = "
                       "rho * steps * step, fitted per board on profiled steps; each device's round on the layers "
                       "P^mask gives it (profiling/train_predict.py)",
              "budget_rounds": rounds,
              "boards": {b: model_record(m) | {"held_out": held[b]} for b, m in models.items()},
              "devices": devices}
    return devices, source


def _checked_text(run_dir: Path, rel: str) -> str:
    """A run file's text, checked against the run's digests.json first."""
    from edgemask.profiling.provenance import read_checked

    return read_checked(run_dir, rel).decode()


def _model_text(model: object) -> str:
    """A ``[model]`` table in one line: its name and arguments."""
    args = getattr(model, "args", {}) or {}
    return f"{getattr(model, 'name', model)}" + (f" ({', '.join(f'{k}={v}' for k, v in sorted(args.items()))})"
                                                 if args else "")
