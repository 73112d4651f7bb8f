"""
The paper's efficiency figure, from the GPU report: the time and the peak memory of a training
step of ToST-Base and of GPT-2 Base against the length of the sequences (equal tokens per step),
the faster row of each model at each length (results/nvidia-h200.json: the report's train_*
sections, or the headline's train).

    python results/render.py             # SPEED.md's table and results/efficiency.png, when they differ
    python results/render.py --check     # exit 1 if either differs from the JSON

Registered with results/render.py twice: the table `gpu_efficiency` (TABLES) and the figure
(FIGURES: png path -> (json path, points, draw)). The figure keeps the points it was drawn from
in its PNG metadata, so --check compares them with the JSON's without drawing (no matplotlib).
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


def draw(points, path):
    """Two panels, log-log: ms per step and peak GB against T, ToST and GPT-2; an eager ToST
    point is hollow. The points go into the PNG's metadata (results/render.py reads them back)."""
    import json

    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import cli
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for arch, label, color in (("tost", "ToST-Base", "tab:blue"), ("gpt2", "GPT-2 Base", "tab:orange")):
        mine = [p for p in points if p["arch"] == arch]
        for ax, key in zip(axes, ("ms", "peak_gb")):
            shown = [p for p in mine if p[key] is not None]
            ax.plot([p["T"] for p in shown], [p[key] for p in shown], color=color, label=label, linewidth=1)
            for p in shown:
                ax.plot(p["T"], p[key], "o", color=color, markerfacecolor="white" if p["eager"] else color)
    plain = matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}")
    for ax, what in zip(axes, ("ms per training step (equal tokens)", "peak GB allocated")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda T, _: f"{T / 1024:g}K"))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_title(what, fontsize=10)
    axes[0].plot([], [], "o", color="grey", markerfacecolor="white", label="eager (its compile failed)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    with cli.atomic_write(path) as f:
        fig.savefig(f, dpi=110, format="png", metadata={"Description": json.dumps(points, sort_keys=True)})
    plt.close(fig)


TABLES = {"gpu_efficiency": (REPORT, table_gpu_efficiency)}
FIGURES = {FIGURE: (REPORT, efficiency_points, draw)}
