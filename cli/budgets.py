"""``edgemask budgets``: PerFedMask's ψ_n from a campaign's measured training steps (:mod:`edgemask.profiling.budgets`)
written into a new training config, with where each came from."""

from __future__ import annotations

import math
from pathlib import Path

from edgemask.errors import ConfigError, EdgemaskError
from edgemask.fileio import sha256_file, write_text_atomic
from edgemask.tomlio import dumps_toml, read_toml


def parse_mix(text: str) -> dict[str, float]:
    """``"local=0.3,pi=0.7"`` -> ``{"local": 0.3, "pi": 0.7}``; a mistake names the part."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        board, sep, share = part.partition("=")
        try:
            value = float(share)
        except ValueError:
            value = math.nan
        if not sep or not board or not math.isfinite(value):
            raise ConfigError(f"--mix: {part!r} is not <board>=<share>; e.g. --mix jetson-tx2=0.3,rpi4=0.7")
        if board in mix:
            raise ConfigError(f"--mix: board {board!r} is given twice")
        mix[board] = value
    return mix


def write_budgets(config: Path, results: Path, mix: dict[str, float], deadline_s: float, out: Path,
                  fmt: str = "torch-train", threads: int = 1, measured_run: str | None = None,
                  run_id: str | None = None, allow_invalid: bool = False) -> dict[str, dict]:
    """Read the PerFedMask training config ``config``, fit each board's step cost to the VALID ``fmt`` rows of
    ``measured_run`` (default: the config's run id) in ``results``, set every device's budget for the
    ``deadline_s`` local round, and write the config with ``budgets`` and ``budget_source`` to ``out`` (run id
    ``run_id``, default ``<run id>-measured``). ``allow_invalid``: fit INVALID rows too (a stand-in's noisy steps),
    recorded in ``budget_source`` as resting on them. Returns the per-device records."""
    from edgemask.profiling.budgets import assign_boards, budgets_from_costs, fit_board_costs, source_record
    from edgemask.profiling.training import training_costs
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.data import build_dataset
    from edgemask.trainer.models import build_model, head_names

    cfg = TrainConfig.load(config)
    if cfg.algorithm.name != "perfedmask":
        raise ConfigError(f"{config}: [algorithm] name is {cfg.algorithm.name!r}; budgets are PerFedMask's ψ_n")
    if out.resolve() == Path(config).resolve():
        raise EdgemaskError(f"--out {out}: the input config itself; write the measured budgets to a new file")
    measured_run = measured_run or cfg.run_id
    ds = build_dataset(cfg.data, cfg.run.seed)
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes, **cfg.model.args)
    head = set(head_names(model))
    d_w = sum(p.numel() for n, p in model.named_parameters() if n not in head)
    rows = training_costs(results)
    rows = rows[(rows["run_id"] == measured_run) & (rows["format"] == fmt) & (rows["threads"] == threads)]
    valid = rows if allow_invalid else rows[rows["verdict"] == "VALID"]
    if valid.empty:
        raise ConfigError(f"{results}: no VALID {fmt} rows of run {measured_run} at {threads} thread(s); measure its "
                          f"training artifacts first (a campaign with formats = [\"{fmt}\"])")
    costs = fit_board_costs(valid, d_w)
    missing = sorted(set(mix) - set(costs))
    if missing:
        raise ConfigError(f"--mix: no VALID {fmt} rows measured on {', '.join(missing)} in {results}; boards measured: "
                          f"{', '.join(sorted(costs))}")
    B, E = cfg.training.batch_size, cfg.training.local_epochs
    steps = {c.client_id: max(1, math.ceil(len(c.train_y) / B)) * E for c in ds.clients}
    boards = assign_boards(list(steps), mix, cfg.run.seed)
    devices = budgets_from_costs(steps, boards, costs, deadline_s)
    store = Path(results) / "results.sqlite"
    source = source_record(str(results), sha256_file(store) if store.is_file() else "", fmt, threads, measured_run,
                           deadline_s, mix, costs, devices)
    data = read_toml(config)
    data.setdefault("run", {})["run_id"] = run_id or f"{cfg.run_id}-measured"
    args = data.setdefault("algorithm", {}).setdefault("args", {})
    args["budgets"] = [devices[c]["fraction"] for c in steps]
    if allow_invalid:
        invalid = sorted(set(valid.loc[valid["verdict"] != "VALID", "device"]))
        source["invalid_rows_on"] = invalid  # --allow-invalid: these boards' fits rest on INVALID rows
    args["budget_source"] = source
    text = (f"# Written by `edgemask budgets` from {config}: PerFedMask's budgets psi_n / d_w from the {fmt} steps "
            f"measured in {results}\n# (deadline {deadline_s:g} s per local round; algorithm.args.budget_source says "
            f"how each was set).\n" + dumps_toml(data))
    TrainConfig.from_dict(data, str(out))  # what is written reads back as a training config
    write_text_atomic(out, text)
    return devices
