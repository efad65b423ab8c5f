"""The report's figures. Each function takes a DataFrame and returns a matplotlib ``Figure`` or None when there
is nothing to draw; ``to_png`` renders it. Figures are built without pyplot (no global state, thread-safe,
always the Agg backend)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _label(row: pd.Series | Mapping) -> str:
    return f"{row['client_id']}" if row.get("client_id") else str(row["artifact"])


def _panel_grid(df: pd.DataFrame) -> tuple[Figure, list]:
    """A figure with one panel per device × format × variant × threads (two columns), and the
    ``(axes, ((device, format, variant, threads), rows))`` pairs to draw into."""
    groups = list(df.groupby(["device", "format", "variant", "threads"], sort=True))
    ncols = min(2, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig = Figure(figsize=(6.5 * ncols, 3.2 * nrows), layout="constrained")
    return fig, [(fig.add_subplot(nrows, ncols, i + 1), grp) for i, grp in enumerate(groups)]


def latency_distributions(df: pd.DataFrame) -> Figure | None:
    """Box plots of the raw latency samples: one panel per device × format (× variant, threads), one box per
    artifact (all repetitions pooled)."""
    ok = df[df["ok"].astype(bool) & df["latency_ms"].map(len).gt(0)]
    if ok.empty:
        return None
    fig, panels = _panel_grid(ok)
    for ax, ((device, fmt, variant, threads), g) in panels:
        by_artifact = g.groupby("artifact", sort=True)
        data = [np.concatenate([np.asarray(x, float) for x in a["latency_ms"]]) for _, a in by_artifact]
        labels = [f"{a.iloc[0]['run_id']}\n{a.iloc[0]['client_id']}" if a.iloc[0].get("run_id") else name
                  for name, a in by_artifact]
        box = ax.boxplot(data, tick_labels=labels, showfliers=True, patch_artist=True, flierprops={"markersize": 2})
        for patch, (_, a) in zip(box["boxes"], by_artifact):
            patch.set_facecolor("#c6dbef" if a.iloc[0].get("kind") != "dense" else "#fdd0a2")
        ax.set_title(f"{device} · {fmt}/{variant} · {threads} thread(s)", fontsize=9)
        ax.set_ylabel("latency (ms)")
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.grid(axis="y", alpha=0.3)
    return fig


def speedup_vs_bound(summary: pd.DataFrame) -> Figure | None:
    """Measured speedup over the dense baseline against the FLOP-reduction bound; y = x is the bound."""
    rows = summary[(summary["kind"] != "dense") & np.isfinite(summary["speedup"].astype(float))
                   & np.isfinite(summary["flop_bound"].astype(float))]
    if rows.empty:
        return None
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    for (device, fmt), g in rows.groupby(["device", "format"], sort=True):
        ax.scatter(g["flop_bound"].astype(float), g["speedup"].astype(float), label=f"{device} · {fmt}", s=28)
    hi = float(max(rows["flop_bound"].max(), rows["speedup"].max(), 1.0)) * 1.1
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="y = x (FLOP bound)")
    ax.axhline(1.0, color="grey", lw=0.8, alpha=0.6)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("FLOP-reduction bound (dense FLOPs ÷ compacted FLOPs)")
    ax.set_ylabel("measured speedup (dense p50 ÷ compacted p50)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def accuracy_curve(history: pd.DataFrame) -> pd.DataFrame:
    """From a run's long-format history: per round, mean client accuracy and cumulative bytes (up + down).

    Returns columns round, accuracy, cum_bytes; empty when the history has no accuracy rows.
    """
    acc = history[history["metric"] == "accuracy"]
    clients = acc[acc["client"] != "server"]
    acc = clients if not clients.empty else acc
    if acc.empty:
        return pd.DataFrame(columns=["round", "accuracy", "cum_bytes"])
    per_round = acc.groupby("round")["value"].mean().rename("accuracy")
    traffic = history[history["metric"].isin(["bytes_up", "bytes_down"])].groupby("round")["value"].sum()
    traffic = traffic.reindex(sorted(set(traffic.index) | set(per_round.index)), fill_value=0.0).cumsum()
    out = per_round.to_frame().join(traffic.rename("cum_bytes"), how="left").reset_index()
    return out


def accuracy_vs_communication(curves: Mapping[str, pd.DataFrame]) -> Figure | None:
    """Mean client accuracy against cumulative communication, one line per run (label -> accuracy_curve)."""
    curves = {k: v for k, v in curves.items() if not v.empty}
    if not curves:
        return None
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for label, c in sorted(curves.items()):
        ax.plot(c["cum_bytes"].astype(float) / 1e6, c["accuracy"].astype(float), marker=".", label=label)
    ax.set_xlabel("cumulative communication, up + down (MB)")
    ax.set_ylabel("mean client accuracy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def energy_per_inference(summary: pd.DataFrame) -> Figure | None:
    """Energy per inference (total and above idle) per artifact, one panel per device × format."""
    rows = summary[np.isfinite(summary["energy_mj"].astype(float))]
    if rows.empty:
        return None
    fig, panels = _panel_grid(rows)
    for ax, ((device, fmt, variant, threads), g) in panels:
        x = np.arange(len(g))
        ax.bar(x - 0.2, g["energy_mj"].astype(float), width=0.4, label="total")
        ax.bar(x + 0.2, g["energy_above_idle_mj"].astype(float), width=0.4, label="above idle")
        ax.set_xticks(x, [f"{r.run_id}\n{r.client_id}" for r in g.itertuples()], fontsize=7, rotation=30)
        ax.set_ylabel("energy per inference (mJ)")
        ax.set_title(f"{device} · {fmt}/{variant} · {threads} thread(s)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    return fig
