"""Which output units of a layer compaction removes: the one rule export's compactor and the trainer's FLOP count
share (``export/compact/compact.py`` finds the units on Torch-Pruning's graph; ``trainer/accounting.py`` on a
probe pass), so a training FLOP is counted only where the compacted model computes.

A unit goes when it is

* **dead** (row rule): its row is zero in every producer that writes it, so it outputs exactly zero; or
* **unread** (column rule): no consumer reads it — its column is zero in every consumer's rows that stay, and only
  channel-local ops lie between (FedMask's group lasso, Eq. 9, drives mask columns to zero as well as rows).

Removing a consumer's unread rows can leave more of its input columns unread, so the rule runs to a fixed point.
A layer whose every unit goes, but not every one dead, keeps its first unit that is not dead (a zero-width layer
would not export; the consumers then output their biases), and that unit's row keeps reading its inputs.
"""

from __future__ import annotations

import torch


def removed_units(dead: torch.Tensor, unread: torch.Tensor) -> torch.Tensor:
    """Bool per output unit of one layer ``(units,)``: does compaction remove it? ``dead``: removable by the row
    rule; ``unread``: by the column rule (either may include the other). A layer with every unit dead comes back
    all removed (export refuses it: the network would be cut). Runs under ``vmap`` (no data-dependent branch)."""
    gone = dead | unread
    live = ~dead
    first_live = live & (torch.cumsum(live.to(torch.int64), 0) == 1)  # (units,): the first unit not dead
    return gone & ~(gone.all() & first_live)
