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
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


DENSE_COLOR, COMPACTED_COLOR, INVALID_COLOR = "#fdae6b", "#6baed6", "#d62728"
SLOW_FACTOR = 2.0  # a latency sample above this × its setting's median is counted as a slow outlier
LOG_SPAN = 3.0  # a panel's latencies spanning more than this factor are drawn on a log axis
# A panel with more settings or clients than this draws them aggregated (ranked bands, lines, boxes, density)
# instead of one labelled box, bar or marker each: at 400 clients one each would pile up past reading.
AGGREGATE_ABOVE = 24


def _digests(df: pd.DataFrame) -> list[str]:
    """Each row's model sha256, "" where unknown (a groupable key, unlike None or NaN)."""
    if "artifact_sha256" not in df.columns:
        return [""] * len(df)
    return ["" if d is None or (isinstance(d, float) and math.isnan(d)) else str(d) for d in df["artifact_sha256"]]


def _panel_grid(df: pd.DataFrame, ncols: int = 2, size: tuple[float, float] = (6.5, 3.6)) -> tuple[Figure, list]:
    """A figure with one panel per device × format (× variant, threads: named only where the table has more
    than one), and the ``(axes, title, rows)`` triples to draw into."""
    keys = ["device", "format"] + [k for k in ("variant", "threads") if df[k].nunique() > 1]
    groups = list(df.groupby(keys, sort=True))
    ncols = min(ncols, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    out = []
    for i, (values, rows) in enumerate(groups):
        title = " · ".join(f"{v} thread(s)" if k == "threads" else str(v) for k, v in zip(keys, values))
        out.append((fig.add_subplot(nrows, ncols, i + 1), title, rows))
    return fig, out


def _tick_labels(rows: pd.DataFrame) -> list[str]:
    """Each setting's client name; a dense baseline's run too where the panel holds several runs, and every
    client's run where several runs have clients."""
    runs = rows["run_id"].nunique()
    client_runs = rows.loc[rows["kind"] != "dense", "run_id"].nunique()
    return [f"{r.client_id}\n{r.run_id}" if (r.kind == "dense" and runs > 1) or client_runs > 1
            else str(r.client_id) for r in rows.itertuples()]


def _plain_log_ticks(axis, lo: float, hi: float) -> None:
    """Label a log axis in plain numbers (0.006, 0.01, 2), not powers of ten: the decades and, between them,
    every tick where the axis spans less than a decade, else the 2s and 5s."""
    shown = "23456789" if hi / lo < 10 else "25"
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in shown else ""))


def _setting_order(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run, its dense baseline first, then its clients in name order."""
    return rows.assign(_d=(rows["kind"] != "dense").astype(int)).sort_values(["run_id", "_d", "client_id"])


def latency_distributions(df: pd.DataFrame, summary: pd.DataFrame | None = None) -> Figure | None:
    """One box per setting, one panel per device × format, on a log latency axis where the panel's p1..p99 span
    more than ``LOG_SPAN``× (a linear one otherwise): the box spans p25–p75 with the median, the whiskers p1 and
    p99; the samples slower than ``SLOW_FACTOR`` × the median are counted above each box, not drawn (a few slow
    outliers among 10⁴ samples would otherwise draw a wall). With ``summary``
    (``profiling.stats.summarize``), an INVALID setting's box is hatched and red-edged."""
    ok = df[df["ok"].astype(bool) & df["latency_ms"].map(len).gt(0)]
    if ok.empty:
        return None
    # one box per setting and model file: repetitions of two files (artifact_sha256) are never pooled
    ok = ok.assign(artifact_sha256=_digests(ok))
    valid = {} if summary is None else {
        (r.artifact, r.format, r.variant, r.device, r.threads, d): bool(r.valid)
        for r, d in zip(summary.itertuples(), _digests(summary))}
    settings = ok.groupby(["artifact", "format", "variant", "device", "threads", "artifact_sha256"],
                          sort=False).agg(
        run_id=("run_id", "first"), client_id=("client_id", "first"), kind=("kind", "first"),
        samples=("latency_ms", lambda xs: np.concatenate([np.asarray(x, float) for x in xs]))).reset_index()
    if _most_per_panel(settings) > AGGREGATE_ABOVE:
        return _latency_ranked(settings, valid, ok)
    fig, panels = _panel_grid(settings, size=(0.55 * settings["artifact"].nunique() + 2.5, 3.8))
    for ax, title, rows in panels:
        rows = _setting_order(rows)
        box = ax.boxplot(list(rows["samples"]), whis=(1, 99), showfliers=False, patch_artist=True, widths=0.6,
                         tick_labels=_tick_labels(rows), medianprops={"color": "black"})
        for i, (patch, r) in enumerate(zip(box["boxes"], rows.itertuples())):
            patch.set_facecolor(DENSE_COLOR if r.kind == "dense" else COMPACTED_COLOR)
            if not valid.get((r.artifact, r.format, r.variant, r.device, r.threads, r.artifact_sha256), True):
                patch.set_hatch("///")
                patch.set_edgecolor(INVALID_COLOR)
            median, top = np.percentile(r.samples, [50, 99])
            slow = int((r.samples > SLOW_FACTOR * median).sum())
            ax.annotate(f"{slow:,}", (i + 1, top), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color=INVALID_COLOR if slow else "#555")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=7, rotation=45)
        ax.grid(axis="y", which="both", alpha=0.3)
        lo = min(np.percentile(x, 1) for x in rows["samples"])
        hi = max(np.percentile(x, 99) for x in rows["samples"])
        if hi / lo > LOG_SPAN:  # settings apart by more than LOG_SPAN: a log axis shows each one's spread
            ax.set_yscale("log")
            top = hi * (hi / lo) ** 0.12  # room for the counts above the top whisker
            ax.set_ylim(lo / (hi / lo) ** 0.05, top)
            _plain_log_ticks(ax.yaxis, lo, top)
            ax.set_ylabel("latency per inference (ms, log)")
        else:
            ax.set_ylim(max(0.0, lo - 0.05 * (hi - lo)), hi + 0.15 * (hi - lo))
            ax.set_ylabel("latency per inference (ms)")
    handles = [Patch(facecolor=DENSE_COLOR, label="dense baseline"),
               Patch(facecolor=COMPACTED_COLOR, label="compacted client"),
               Patch(facecolor="white", edgecolor=INVALID_COLOR, hatch="///", label="INVALID setting")]
    loops = pd.to_numeric(ok.get("inferences_per_sample", pd.Series(1, index=ok.index))).fillna(1)
    sample = ("a sample: the mean of back-to-back inferences (the runner's sample_min_ms)" if (loops > 1).any()
              else "a sample: one inference")
    fig.legend(handles=handles if valid else handles[:2], loc="outside lower center", ncols=3, fontsize=8,
               title=f"box p25–p75 and median, whiskers p1–p99; number above: samples slower than "
                     f"{SLOW_FACTOR:g}× the median (not drawn); {sample}", title_fontsize=8)
    return fig


def _most_per_panel(df: pd.DataFrame) -> int:
    """The most rows one panel of :func:`_panel_grid` would hold."""
    keys = ["device", "format"] + [k for k in ("variant", "threads") if df[k].nunique() > 1]
    return int(df.groupby(keys).size().max()) if len(df) else 0


def _sample_text(ok: pd.DataFrame) -> str:
    loops = pd.to_numeric(ok.get("inferences_per_sample", pd.Series(1, index=ok.index))).fillna(1)
    return ("a sample: the mean of back-to-back inferences (the runner's sample_min_ms)" if (loops > 1).any()
            else "a sample: one inference")


def _log_or_linear(ax, lo: float, hi: float, label: str, room: float = 0.05) -> None:
    if hi / lo > LOG_SPAN:
        ax.set_yscale("log")
        ax.set_ylim(lo / (hi / lo) ** 0.05, hi * (hi / lo) ** room)
        _plain_log_ticks(ax.yaxis, lo, hi)
        ax.set_ylabel(f"{label} (ms, log)")
    else:
        ax.set_ylim(max(0.0, lo - 0.05 * (hi - lo)), hi + 0.08 * (hi - lo))
        ax.set_ylabel(f"{label} (ms)")


def _latency_ranked(settings: pd.DataFrame, valid: dict, ok: pd.DataFrame) -> Figure:
    """The many-settings form of :func:`latency_distributions`: per panel, the settings ranked by median, each a
    thin p1–p99 line and a thick p25–p75 one with its median as a dot, the dense baseline in its colour and as a
    dashed line across; the slow samples counted in the title, not per setting."""
    fig, panels = _panel_grid(settings, size=(6.5, 3.8))
    for ax, title, rows in panels:
        q = np.array([np.percentile(x, [1, 25, 50, 75, 99]) for x in rows["samples"]])  # (settings, 5)
        slow = np.array([int((x > SLOW_FACTOR * m).sum()) for x, m in zip(rows["samples"], q[:, 2])])
        order = np.argsort(q[:, 2], kind="stable")
        q, slow, rows = q[order], slow[order], rows.iloc[order]
        ok_ = np.array([valid.get((r.artifact, r.format, r.variant, r.device, r.threads, r.artifact_sha256), True)
                        for r in rows.itertuples()])
        dense = (rows["kind"] == "dense").to_numpy()
        color = np.where(~ok_, INVALID_COLOR, np.where(dense, DENSE_COLOR, "#2171b5"))
        x = np.arange(len(rows))
        ax.vlines(x, q[:, 0], q[:, 4], colors=color, lw=0.6, alpha=0.6)
        ax.vlines(x, q[:, 1], q[:, 3], colors=color, lw=2.2)
        ax.scatter(x, q[:, 2], s=4, color="black", zorder=3)
        for i in np.flatnonzero(dense):
            ax.axhline(q[i, 2], color=DENSE_COLOR, ls="--", lw=1.0, zorder=1)
            ax.scatter([x[i]], [q[i, 2]], s=50, marker="D", color=DENSE_COLOR, edgecolor="black", zorder=4)
        _log_or_linear(ax, float(q[:, 0].min()), float(q[:, 4].max()), "latency per inference")
        n_slow = int((slow > 0).sum())
        ax.set_title(f"{title}  ({len(rows)} settings; {int(slow.sum()):,} slow samples in {n_slow})", fontsize=10)
        ax.set_xlabel("settings, ranked by median latency")
        ax.set_xticks([])
        ax.set_xlim(-1, len(rows))
        ax.grid(axis="y", which="both", alpha=0.3)
    handles = [Line2D([], [], color="#2171b5", lw=2.2, label="compacted client: p25–p75"),
               Line2D([], [], color="#2171b5", lw=0.6, label="p1–p99"),
               Line2D([], [], marker="o", ls="", color="black", markersize=3, label="median"),
               Line2D([], [], marker="D", ls="--", color=DENSE_COLOR, markeredgecolor="black",
                      label="dense baseline (its median across)")]
    if valid and not all(valid.values()):
        handles.append(Line2D([], [], color=INVALID_COLOR, lw=2.2, label="INVALID setting"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8,
               title=f"one column per setting; slow: samples above {SLOW_FACTOR:g}× their setting's median; "
                     f"{_sample_text(ok)}", title_fontsize=8)
    return fig


def speedup_per_client(summary: pd.DataFrame) -> Figure | None:
    """Per compacted client, sorted by its FLOP bound: the measured speedup over its run's dense baseline (dense
    p50 ÷ compacted p50) beside the two ratios it could follow — the FLOP bound (dense ÷ compacted FLOPs) and
    the parameter-byte ratio (dense ÷ compacted parameter bytes). One panel per device × format; a speedup that
    rests on an INVALID verdict (the client's or its baseline's) is drawn hollow and red."""
    rows = summary[(summary["kind"] != "dense") & np.isfinite(summary["speedup"].astype(float))]
    if rows.empty:
        return None
    many = _most_per_panel(rows) > AGGREGATE_ABOVE
    fig, panels = _panel_grid(rows, size=(6.5 if many else 0.5 * rows["artifact"].nunique() + 3.0, 3.8))
    for ax, title, g in panels:
        g = g.assign(_b=g["flop_bound"].astype(float)).sort_values(["_b", "artifact"])
        x = np.arange(len(g))
        valid = g["comparison_valid"].astype(bool).to_numpy()
        speed = g["speedup"].astype(float).to_numpy()
        if many:  # the bounds as lines over the ranked clients, each measurement a small dot on them
            ax.plot(x, g["flop_bound"].astype(float), color="#636363", lw=1.6, label="FLOP bound", zorder=2)
            ax.plot(x, g["param_ratio"].astype(float), color="#31a354", lw=1.0, ls="--",
                    label="parameter-byte ratio", zorder=2)
            ax.scatter(x[valid], speed[valid], s=10, color="#08519c", label="measured speedup (VALID)", zorder=3)
            ax.scatter(x[~valid], speed[~valid], s=12, facecolor="none", edgecolor=INVALID_COLOR, linewidths=0.8,
                       label="measured speedup (INVALID)", zorder=3)
            ax.set_xticks([])
            ax.set_xlabel(f"{len(g)} clients, sorted by FLOP bound")
        else:
            # the two bounds side by side (they often coincide), the measurement between them and the next client
            ax.scatter(x - 0.15, g["flop_bound"].astype(float), marker="^", s=40, color="#636363",
                       label="FLOP bound", zorder=2)
            ax.scatter(x + 0.15, g["param_ratio"].astype(float), marker="s", s=26, color="#31a354",
                       label="parameter-byte ratio", zorder=2)
            ax.scatter(x[valid], speed[valid], s=46, color="#08519c", label="measured speedup (VALID)", zorder=3)
            ax.scatter(x[~valid], speed[~valid], s=46, facecolor="none", edgecolor=INVALID_COLOR, linewidths=1.5,
                       label="measured speedup (INVALID)", zorder=3)
            ax.set_xticks(x, _tick_labels(g), fontsize=7, rotation=45)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.set_xlim(-0.6, len(g) - 0.4)
        ax.set_title(title if many else f"{title}  (clients sorted by FLOP bound)", fontsize=10)
        ax.set_ylabel("× over the dense baseline (log)")
        ax.grid(axis="y", which="both", alpha=0.3)
        lo = min(0.8, float(np.nanmin(speed)) * 0.8)
        hi = max(float(np.nanmax(g[["flop_bound", "param_ratio", "speedup"]].astype(float).to_numpy())) * 1.3, 2)
        ax.set_ylim(lo, hi)
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    return fig


def accuracy_curve(history: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """From a run's long-format history: per round, mean client ``metric`` (``accuracy``, or a further measure an
    algorithm reports, e.g. FedMask's ``accuracy_returned_mask``) and cumulative bytes (up + down).

    Returns columns round, accuracy, cum_bytes; empty when the history has no such rows.
    """
    acc = history[history["metric"] == metric]
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
    """Mean client accuracy against cumulative bytes communicated (up + down, log axis: algorithms differ by
    orders of magnitude), one line per run (label -> accuracy_curve), its last round's accuracy written at its
    end."""
    curves = {k: v for k, v in curves.items() if not v.empty}
    if not curves:
        return None
    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for label, c in sorted(curves.items()):
        mb = c["cum_bytes"].astype(float).to_numpy() / 1e6
        acc = 100 * c["accuracy"].astype(float).to_numpy()
        line, = ax.plot(mb, acc, marker=".", label=label)
        ax.annotate(f"{acc[-1]:.1f} %\n{len(c)} rounds\n{mb[-1]:.3g} MB", (mb[-1], acc[-1]), xytext=(6, 0),
                    textcoords="offset points", ha="left", va="center", fontsize=7, color=line.get_color())
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi * 3)  # room for the end labels
    _plain_log_ticks(ax.xaxis, lo, hi * 3)
    ax.set_xlabel("bytes communicated so far, up + down, all clients (MB, log)")
    ax.set_ylabel("mean client accuracy (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return fig


def energy_per_inference(summary: pd.DataFrame) -> Figure | None:
    """Energy per inference (total and above idle) per setting, one panel per device × format; an INVALID
    setting's bars are hatched."""
    rows = summary[np.isfinite(summary["energy_mj"].astype(float))]
    if rows.empty:
        return None
    if _most_per_panel(rows) > AGGREGATE_ABOVE:
        return _energy_boxes(rows)
    fig, panels = _panel_grid(rows)
    for ax, title, g in panels:
        g = _setting_order(g)
        x = np.arange(len(g))
        hatch = ["" if v else "///" for v in g["valid"].astype(bool)]
        ax.bar(x - 0.2, g["energy_mj"].astype(float), width=0.4, label="total", hatch=hatch)
        ax.bar(x + 0.2, g["energy_above_idle_mj"].astype(float), width=0.4, label="above idle", hatch=hatch)
        ax.set_xticks(x, _tick_labels(g), fontsize=7, rotation=45)
        ax.set_ylabel("energy per inference (mJ)")
        ax.set_title(title + ("  (hatched: INVALID)" if not g["valid"].all() else ""), fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    return fig


def _energy_boxes(rows: pd.DataFrame) -> Figure:
    """The many-settings form of :func:`energy_per_inference`: per panel, the compacted clients' energy (total
    and above idle) as two boxes with every client a dot, the dense baseline as a diamond beside each."""
    fig, panels = _panel_grid(rows, size=(5.2, 3.8))
    for ax, title, g in panels:
        comp, dense = g[g["kind"] != "dense"], g[g["kind"] == "dense"]
        invalid = int((~g["valid"].astype(bool)).sum())
        for i, (col, color) in enumerate((("energy_mj", "#1f77b4"), ("energy_above_idle_mj", "#ff7f0e"))):
            vals = comp[col].astype(float).to_numpy()
            vals = vals[np.isfinite(vals)]
            if len(vals):
                ax.boxplot([vals], positions=[i], widths=0.5, whis=(5, 95), showfliers=False, patch_artist=True,
                           boxprops={"facecolor": color, "alpha": 0.35}, medianprops={"color": "black"})
                jitter = np.random.default_rng(i).uniform(-0.18, 0.18, len(vals))
                ax.scatter(i + jitter, vals, s=4, color=color, alpha=0.5, zorder=3)
            d = dense[col].astype(float)
            ax.scatter([i + 0.38] * len(d), d, marker="D", s=40, color=DENSE_COLOR, edgecolor="black", zorder=4)
        ax.set_xticks([0, 1], [f"total\n({len(comp)} clients)", "above idle"])
        ax.set_xlim(-0.6, 1.7)
        ax.set_ylabel("energy per inference (mJ)")
        ax.set_title(title + (f"  ({invalid} INVALID among them)" if invalid else ""), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(facecolor="#bdbdbd", label="compacted clients: box p25–p75, median, whiskers p5–p95; "
                                                "dots: each client"),
               Line2D([], [], marker="D", ls="", color=DENSE_COLOR, markeredgecolor="black", label="dense baseline")]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    return fig


MAX_LAYER_PANELS = 8  # the stacked-bar figure draws at most this many settings (the tables list them all)


def layer_time_stacks(breakdowns) -> Figure | None:
    """Where the time goes: per compacted artifact × setting (a ``profiling.layers.LayerBreakdown``), two
    stacked bars — dense and compacted — one segment per layer (same colour in both) plus the operators no layer
    claims, in median ms of the profiled runs. A layer flagged for realizing less than half its FLOP bound is
    hatched in the compacted bar."""
    every = list(breakdowns)
    bds = every[:MAX_LAYER_PANELS]
    if not bds:
        return None
    ncols = min(2, len(bds))
    nrows = math.ceil(len(bds) / ncols)
    fig = Figure(figsize=(6.0 * ncols, 3.8 * nrows), layout="constrained")
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    for i, bd in enumerate(bds):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        segments = [(r.layer, r.dense_ms, r.compacted_ms, r.flagged) for r in bd.rows]
        segments.append(("(other)", bd.other_dense_ms, bd.other_compacted_ms, False))
        bottoms = [0.0, 0.0]
        for k, (layer, d, c, flagged) in enumerate(segments):
            vals = [0.0 if not math.isfinite(d) else d, 0.0 if not math.isfinite(c) else c]
            color = "#bdbdbd" if layer == "(other)" else cmap(k % 20)
            ax.bar([0], vals[:1], bottom=bottoms[:1], color=color, edgecolor="white", width=0.6, label=layer)
            ax.bar([1], vals[1:], bottom=bottoms[1:], color=color, edgecolor="black" if flagged else "white",
                   hatch="//" if flagged else None, width=0.6)
            bottoms = [bottoms[0] + vals[0], bottoms[1] + vals[1]]
        ax.set_xticks([0, 1], ["dense", "compacted"])
        ax.set_ylabel("ms per inference (median of profiled runs)")
        ax.set_title(f"{bd.artifact}\n{bd.device} · {bd.format}/{bd.variant} · {bd.threads} thread(s)"
                     + ("\nSUSPECT: unchanged layers differ" if bd.suspect else ""), fontsize=9,
                     color=INVALID_COLOR if bd.suspect else "black")
        ax.legend(fontsize=6, ncols=2, loc="upper right", title="layer (hatched: < ½ FLOP bound)",
                  title_fontsize=6)
        ax.grid(axis="y", alpha=0.3)
    if len(every) > len(bds):
        fig.suptitle(f"the first {len(bds)} of {len(every)} comparisons (the per-layer tables list every one)",
                     fontsize=9)
    return fig


ALGORITHM_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def accuracy_vs_latency(ledger: pd.DataFrame) -> Figure | None:
    """The Pareto view of ``clients.parquet`` (``profiling.ledger``): per device × format, each client's
    personalized accuracy against the measured p50 latency of its model, one colour per algorithm; an INVALID
    setting's point hollow; the clients on the front (``on_front``, VALID settings only) joined by a step line
    and ringed."""
    if ledger.empty or ledger["p50_ms"].notna().sum() == 0:
        return None
    df = ledger[ledger["p50_ms"].notna() & ledger["accuracy"].notna()]
    if df.empty:
        return None
    algos = sorted(df["algorithm"].fillna("?").astype(str).unique())
    color = {a: ALGORITHM_COLORS[i % len(ALGORITHM_COLORS)] for i, a in enumerate(algos)}
    many = _most_per_panel(df) > AGGREGATE_ABOVE
    size, ring = (14, 45) if many else (40, 110)
    fig, panels = _panel_grid(df, size=(5.2, 3.8))
    for ax, title, rows in panels:
        for algo, g in rows.groupby(rows["algorithm"].fillna("?").astype(str), sort=True):
            valid = g["valid"].fillna(False).astype(bool).to_numpy()
            ax.scatter(g["p50_ms"][valid], g["accuracy"][valid], s=size, color=color[algo], zorder=3,
                       alpha=0.7 if many else 1.0, linewidths=0)
            ax.scatter(g["p50_ms"][~valid], g["accuracy"][~valid], s=size, facecolor="none", edgecolor=color[algo],
                       linewidths=1.0 if many else 1.5, zorder=3)
        front = rows[rows["on_front"].astype(bool)].sort_values("p50_ms")
        if len(front):
            ax.step(front["p50_ms"], front["accuracy"], where="post", color="black", lw=0.8, zorder=2)
            ax.scatter(front["p50_ms"], front["accuracy"], s=ring, facecolor="none", edgecolor="black",
                       linewidths=0.8, zorder=2)
        # many clients: only those on the front are named (every name would overlap its neighbours)
        for r in (front if many else rows).itertuples():
            ax.annotate(str(r.client_id).replace("client-", ""), (r.p50_ms, r.accuracy), xytext=(3, 3),
                        textcoords="offset points", fontsize=6, color="#555")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("measured p50 latency per inference (ms)")
        ax.set_ylabel("personalized accuracy")
        ax.grid(alpha=0.3)
    handles = [Patch(facecolor=color[a], label=a) for a in algos]
    handles += [Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor="#555",
                       label="INVALID setting (hollow)"),
                Line2D([], [], marker="o", ls="-", color="black", markerfacecolor="none", markersize=9,
                       label="Pareto front (VALID settings)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), fontsize=8,
               title=f"one point per client (label: client number{', on the front only' if many else ''}); a run "
                     "without client artifacts (FedAvg): each client on the run's dense model",
               title_fontsize=8)
    return fig


def measured_and_predicted(summary: pd.DataFrame, predicted: pd.DataFrame | None) -> Figure | None:
    """Per device × format panel: every compacted client's p50 against its compacted FLOPs, measured clients as
    filled circles (hollow red when INVALID), predicted ones as crosses: a prediction is never drawn as a
    measurement."""
    if predicted is None or predicted.empty:
        return None
    both = pd.concat([summary[summary["kind"] == "compacted"].assign(_pred=False), predicted.assign(_pred=True)],
                     ignore_index=True)
    many = int(both.groupby(["device", "format", "variant", "threads"])["_pred"].sum().max()) > AGGREGATE_ABOVE
    fig, panels = _panel_grid(both)
    for ax, title, g in panels:
        x, y = g["flops_compacted"].astype(float).to_numpy(), g["p50_ms"].astype(float).to_numpy()
        pred = g["_pred"].astype(bool).to_numpy()
        valid = g["valid"].astype(bool).to_numpy() & ~pred
        bad = ~valid & ~pred
        if many and pred.sum() > 1:  # predicted clients as a density under the measured ones
            ax.hexbin(x[pred], y[pred], gridsize=28, mincnt=1, cmap=_predicted_cmap(), linewidths=0.2, zorder=1)
        else:
            ax.scatter(x[pred], y[pred], marker="x", s=40, color=PREDICTED_COLOR, zorder=2)
        # measured on top, edged in white: a prediction never hides (nor is drawn as) a measurement
        ax.scatter(x[valid], y[valid], marker="o", s=36, color="#08519c", edgecolor="white", linewidths=0.6,
                   zorder=3)
        ax.scatter(x[bad], y[bad], marker="o", s=36, facecolor="white", edgecolor=INVALID_COLOR, zorder=3)
        ax.set_title(f"{title}  ({int((~pred).sum())} measured, {int(pred.sum())} predicted)", fontsize=10)
        ax.set_xlabel("compacted FLOPs per inference")
        ax.set_ylabel("p50 latency, ms")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], marker="o", ls="", color="#08519c", markeredgecolor="white", markersize=7,
                      label="measured (VALID)"),
               Line2D([], [], marker="o", ls="", markerfacecolor="white", markeredgecolor=INVALID_COLOR, markersize=7,
                      label="measured (INVALID)"),
               Patch(facecolor=_predicted_cmap()(0.4), label="predicted (not measured): clients per hexagon, "
                                                            "darker = more")
               if many else Line2D([], [], marker="x", ls="", color=PREDICTED_COLOR, markersize=7,
                                   label="predicted (not measured)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)
    return fig


PREDICTED_COLOR = "#6a51a3"


def _predicted_cmap():
    """Purples from a visible lilac up: a hexagon holding one predicted client must not read as white."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(colormaps["Purples"](np.linspace(0.35, 1.0, 256)))
