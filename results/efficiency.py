"""
The paper's efficiency figure, from the GPU report: the time and the peak memory of a training
step of ToST-Base and of GPT-2 Base against the length of the sequences (equal tokens per step),
the faster row of each model at each length (results/nvidia-h200.json: the report's train_*
sections, or the headline's train).

    python results/render.py             # SPEED.md's table and results/efficiency.png, when they differ
    python results/render.py --check     # exit 1 if either differs from the JSON

Registered with results/render.py twice: the table `gpu_efficiency` (TABLES) and the figure
(FIGURES: png path -> (json path, points, draw)). The figure keeps the points it was drawn from
and a digest of its pixels in its PNG (results/figure.py), so --check compares them with the
JSON's and the picture with its digest without drawing (Pillow, no matplotlib). A report whose
training sections have not all run is drawn as far as it goes, and the figure says what it lacks.
"""

from results.markdown import table
from results.speed_tables import AWAITED, FIELDS, REPORT, num, ok, train_rows  # noqa: F401  (AWAITED, FIELDS: the same report)

FIGURE = "results/efficiency.png"


def efficiency_points(data):
    """[{T, arch, ms, peak_gb, impl, eager}] : the fastest row of each model at each length (a
    ToST row measured eager because its compile failed counts, marked)."""
    best = {}
    for r in train_rows(data):  # (the report's train_* sections, or the headline's train)
        arch = r.get("arch")
        if not (ok(r) or r.get("status") == "eager") or r.get("ms") is None:
            continue
        if (r["T"], arch) not in best or r["ms"] < best[(r["T"], arch)]["ms"]:
            best[(r["T"], arch)] = dict(T=r["T"], arch=arch, ms=round(r["ms"], 2),
                                        peak_gb=round(r["peak_mb"] / 1024, 2) if r.get("peak_mb") else None,
                                        impl=r.get("impl") or r.get("backend_ran") or r.get("backend"),
                                        eager=r.get("status") == "eager")
    return [best[k] for k in sorted(best)]


def table_gpu_efficiency(data):
    """The figure's points as a table: at each length, each model's faster step and its peak memory."""
    points = efficiency_points(data)
    if not points:
        return "No training row of either model has run."
    by = {(p["T"], p["arch"]): p for p in points}
    body = []
    for T in sorted({p["T"] for p in points}):
        cells = []
        for arch in ("tost", "gpt2"):
            p = by.get((T, arch))
            cells += ["-", "-"] if p is None else [f"{num(p['ms'])} (`{p['impl']}`{', eager' if p['eager'] else ''})",
                                                   num(p["peak_gb"])]
        body.append([f"{T:,}"] + cells)
    return (table(["T", "ToST-Base ms", "ToST-Base peak GB", "GPT-2 Base ms", "GPT-2 Base peak GB"], body)
            + f"\n\n![step time and peak memory against length]({FIGURE.split('/', 1)[1]})")


MODELS = (("tost", "ToST-Base", "tab:blue"), ("gpt2", "GPT-2 Base", "tab:orange"))
PANELS = (("ms", "ms per training step (equal tokens)"), ("peak_gb", "peak GB allocated"))


def drawable(value):
    """A figure a log axis can show (a row may lack its peak memory)."""
    return value is not None and value > 0


def listed(lengths):
    """Lengths as they read: "4,096, 16,384"."""
    return ", ".join(f"{T:,}" for T in lengths)


def missing(points):
    """What the figure lacks, in words (a report whose training sections have not all run): a
    model with no row, the lengths one model ran and the other did not, a panel's figure that
    rows did not measure."""
    lengths, said = sorted({p["T"] for p in points}), []
    for arch, label, _ in MODELS:
        have = {p["T"]: p for p in points if p["arch"] == arch}
        if not have:
            said.append(f"{label}: no training row has run")
            continue
        if len(have) < len(lengths):
            said.append(f"{label} at T={listed([T for T in lengths if T not in have])}")
        for key, what in PANELS:
            lacking = [T for T, p in sorted(have.items()) if not drawable(p[key])]
            if lacking:
                said.append(f"{label}'s {what.split(' (')[0]} at T={listed(lacking)}")
    return said


def draw_panel(ax, points, key, what):
    """One panel, log-log: `key` against T for each model, an eager ToST point hollow; a panel
    with nothing to show says so (a log axis of nothing cannot be drawn)."""
    import matplotlib.ticker
    shown_any = False
    for arch, label, color in MODELS:
        shown = [p for p in points if p["arch"] == arch and drawable(p[key])]
        if not shown:
            continue
        shown_any = True
        ax.plot([p["T"] for p in shown], [p[key] for p in shown], color=color, label=label, linewidth=1)
        for p in shown:
            ax.plot(p["T"], p[key], "o", color=color, markerfacecolor="white" if p["eager"] else color)
    ax.set_title(what, fontsize=10)
    ax.set_xlabel("sequence length T (tokens)")
    if not shown_any:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, "not measured yet", ha="center", va="center", transform=ax.transAxes, color="grey")
        return
    plain = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda T, _: f"{T / 1024:g}K"))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)


def draw(points):
    """Two panels, log-log: ms per step and peak GB against T, ToST and GPT-2; an eager ToST
    point is hollow; what the report has not measured yet is said under them. The points go
    into the PNG (results/figure.py; results/render.py reads them back). Returns (the PNG's
    bytes, what is missing)."""
    from nanotost import plots
    from results import figure
    plt = plots.pyplot()
    lacks = missing(points)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4 + 0.3 * bool(lacks)))
    for ax, (key, what) in zip(axes, PANELS):
        draw_panel(ax, points, key, what)
    axes[0].plot([], [], "o", color="grey", markerfacecolor="white", label="eager (its compile failed)")
    axes[0].legend(fontsize=8)
    if lacks:
        fig.text(0.5, 0.01, "Not measured yet: " + "; ".join(lacks), ha="center", va="bottom", fontsize=7,
                 wrap=True)
    fig.tight_layout(rect=(0, 0.08 if lacks else 0, 1, 1))
    png = figure.png_bytes(fig, points, dpi=110)
    plt.close(fig)
    return png, lacks


TABLES = {"gpu_efficiency": (REPORT, table_gpu_efficiency)}
FIGURES = {FIGURE: (REPORT, efficiency_points, draw)}
