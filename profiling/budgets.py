"""PerFedMask's budgets ψ_n from measured training steps (issue #39).

PerFedMask (Setayesh, Li and Wong, ICLR 2023) gives device n a budget ψ_n, the parameters it can train, "based
on its computational capability"; the poster sets it as a fraction of d_w (ν of the devices the whole body, the
rest ``budget``·d_w). Here the capability is measured: each simulated device is a board of the inventory (a device
mix, e.g. 30 % ``jetson-tx2``, 70 % ``rpi4``), and ψ_n is the largest trainable part whose local round on that
device's board meets a deadline.

The cost model, per board b, from a campaign's VALID training rows of a PerFedMask run's clients (each a step that
trains the layers P^mask gave that client, the rest frozen, measured as ``step_p50_ms``):

    step_ms_b(f) = a_b + s_b · f,    f = trained parameters / d_w               (least squares over the rows)
    round_n(f)   = steps_n · step_ms_b(n)(f)                                    (steps_n = ⌈num_train_n / B⌉ · E)
    ψ_n / d_w    = the largest f in [0, 1] with round_n(f) ≤ deadline            (0 when even f = 0 misses it)

A line in f is a choice: a step's cost depends on which layers train, not only how many parameters (a trained
first layer makes the backward pass run through every layer above it; PerFedMask's own FLOP count says so), so the
fit's largest miss on the measured rows is recorded with it (``max_miss_ms``): a deadline closer than that to a
device's predicted round is not one the model can promise. The run records, per device, its board, the cost
model and the predicted round (``budget_source`` in summary.json). ``steps_n`` counts the steps the host trains
(``trainer.sampling.epoch_steps``: one fewer sample an epoch where ``training.one_sample_batch`` drops a lone last
one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from edgemask.errors import ConfigError


@dataclass(frozen=True)
class BoardCost:
    """``step_ms(f) = a_ms + s_ms · f`` on one board, fitted to ``points`` [(f, measured step p50 ms)]."""

    board: str
    a_ms: float
    s_ms: float
    points: tuple[tuple[float, float], ...]
    max_miss_ms: float

    def step_ms(self, f: float) -> float:
        return self.a_ms + self.s_ms * f

    def largest_fraction(self, steps: int, deadline_ms: float) -> float:
        """The largest f in [0, 1] with ``steps`` · step_ms(f) ≤ ``deadline_ms`` (0 when none)."""
        per_step = deadline_ms / steps
        if self.step_ms(1.0) <= per_step:
            return 1.0
        if self.step_ms(0.0) > per_step or self.s_ms <= 0:
            return 0.0
        return max(0.0, min(1.0, (per_step - self.a_ms) / self.s_ms))


def fit_board_costs(rows: pd.DataFrame, d_w: int) -> dict[str, BoardCost]:
    """One :class:`BoardCost` per ``device`` of ``rows`` (columns ``device``, ``trained_params``, ``step_p50_ms``;
    VALID rows only, the caller's filter). A board needs two distinct trained fractions to fit a line."""
    out = {}
    for board, g in rows.groupby("device", sort=True):
        f = g["trained_params"].to_numpy(dtype=float) / float(d_w)
        t = g["step_p50_ms"].to_numpy(dtype=float)
        if len(np.unique(np.round(f, 9))) < 2:
            raise ConfigError(f"board {board}: its training rows all train {f[0]:.3f} of d_w; measure clients of at "
                              f"least two budgets (a PerFedMask run with nu between 0 and 1) to fit its cost")
        s, a = np.polyfit(f, t, 1)
        miss = float(np.max(np.abs(a + s * f - t)))
        out[str(board)] = BoardCost(str(board), float(a), float(s),
                                    tuple((float(x), float(y)) for x, y in zip(f, t)), miss)
    return out


def budgets_from_costs(steps: dict[str, int], boards: dict[str, str], costs: dict[str, BoardCost],
                       deadline_s: float) -> dict[str, dict]:
    """Per device (``steps``: its local round's steps), its budget fraction and where it came from: the board,
    the steps, the predicted round at that fraction and whether even f = 0 misses the deadline."""
    if not deadline_s > 0:
        raise ConfigError(f"--deadline {deadline_s!r}: expected a positive number of seconds")
    out = {}
    for cid, n_steps in steps.items():
        board = boards[cid]
        if board not in costs:
            raise ConfigError(f"board {board}: no VALID training rows measured on it; measure the run's training "
                              f"artifacts there (campaign formats torch-train / pte-train)")
        c = costs[board]
        f = c.largest_fraction(n_steps, deadline_s * 1e3)
        out[cid] = {"board": board, "fraction": f, "steps_per_round": int(n_steps),
                    "predicted_round_s": n_steps * c.step_ms(f) / 1e3,
                    # even f = 0 (nothing trained) within the deadline; f > 0 meets it by construction
                    "meets_deadline": bool(f > 0 or n_steps * c.step_ms(0.0) <= deadline_s * 1e3)}
    return out


def source_record(results: str, results_sha256: str, fmt: str, threads: int, measured_run: str, deadline_s: float,
                  mix: dict[str, float], costs: dict[str, BoardCost], devices: dict[str, dict]) -> dict:
    """``budget_source`` for the training config: what the budgets rest on, as plain data (TOML-able)."""
    return {"results": results, "results_sha256": results_sha256, "format": fmt, "threads": threads,
            "measured_run": measured_run, "deadline_s": deadline_s, "mix": dict(mix),
            "model": "step_ms = a_ms + s_ms * trained/d_w, least squares per board (profiling/budgets.py)",
            "boards": {b: {k: v for k, v in asdict(c).items() if k not in ("board", "points")}
                       for b, c in costs.items()},
            "devices": devices}
