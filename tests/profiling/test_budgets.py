"""PerFedMask's budgets from measured steps (issue #39): the per-board line, the deadline's fraction, the mix."""

from __future__ import annotations

import pandas as pd
import pytest

from edgemask.errors import ConfigError
from edgemask.mix import assign_boards
from edgemask.profiling.budgets import budgets_from_costs, fit_board_costs

D_W = 1000


def _rows():
    # board a: 10 ms at half the body, 20 ms at all of it -> step_ms = 0 + 20 f; board b: 40 / 60 -> 20 + 40 f
    return pd.DataFrame({"device": ["a", "a", "b", "b"], "trained_params": [500, 1000, 500, 1000],
                         "step_p50_ms": [10.0, 20.0, 40.0, 60.0]})


def test_the_line_and_the_largest_fraction_by_hand():
    costs = fit_board_costs(_rows(), D_W)
    assert costs["a"].a_ms == pytest.approx(0.0, abs=1e-9) and costs["a"].s_ms == pytest.approx(20.0)
    assert costs["b"].a_ms == pytest.approx(20.0) and costs["b"].s_ms == pytest.approx(40.0)
    assert costs["a"].max_miss_ms == pytest.approx(0.0, abs=1e-9)
    out = budgets_from_costs({"d0": 10, "d1": 10, "d2": 5}, {"d0": "a", "d1": "b", "d2": "a"}, costs, 0.15)
    # d0: 150 ms / 10 steps = 15 ms a step = 20 f -> f = 0.75; predicted round = 10 x 15 ms
    assert out["d0"]["fraction"] == pytest.approx(0.75) and out["d0"]["predicted_round_s"] == pytest.approx(0.15)
    assert out["d0"]["meets_deadline"] is True  # at the deadline exactly, whatever the rounding
    # d1: 15 ms a step is below board b's 20 ms at f = 0: it trains nothing and still misses the deadline
    assert out["d1"]["fraction"] == 0.0 and out["d1"]["meets_deadline"] is False
    # d2: 30 ms a step covers the whole body (20 ms)
    assert out["d2"]["fraction"] == 1.0 and out["d2"]["meets_deadline"] is True


def test_one_budget_measured_cannot_fit_a_line():
    rows = _rows()
    rows["trained_params"] = 500
    with pytest.raises(ConfigError, match="at least two budgets"):
        fit_board_costs(rows, D_W)


def test_the_mix_gives_each_board_its_share_whatever_the_names():
    ids = [f"client-{i:03d}" for i in range(10)]
    boards = assign_boards(ids, {"tx2": 0.3, "pi": 0.7}, seed=0)
    assert sorted(boards) == ids
    assert list(boards.values()).count("tx2") == 3 and list(boards.values()).count("pi") == 7
    assert assign_boards(ids, {"tx2": 0.3, "pi": 0.7}, seed=0) == boards  # seeded
    with pytest.raises(ConfigError, match="sum to 1"):
        assign_boards(ids, {"tx2": 0.3, "pi": 0.6}, seed=0)
