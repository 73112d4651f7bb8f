"""
README.md's comparison table (the first screen's lesson), rendered from the JSON that
`python results/compare/pydocs.py --out=results/compare/pydocs_cpu.json` writes: every figure in the table
comes from that file, by this module. Standard library only.

A table sits in a document between `<!-- table: NAME -->` and `<!-- /table -->`; TABLES maps
NAME to (the JSON's path in the repository, fn(data) -> markdown). results/render.py rewrites
the blocks and checks them; results/compare/pydocs.py prints the same table when it finishes.
"""

import textwrap

from results.markdown import spread, table

CONDITION_LABELS = {"iters": "equal iterations", "time": "equal wall time"}


def cells(rows, name, n):
    """Val loss and corpus-word share of model `name` run for n iterations, over its seeds."""
    mine = [r for r in rows if r["model"] == name and r["iters"] == n]
    return spread([r["val_loss"] for r in mine], "{:.3f}"), spread([100 * r["share"] for r in mine], "{:.0f}%")


def compare_table(data):
    """The markdown: one row per model; per condition the val loss and the corpus-word share
    (mean and min-max over the seeds), at equal time also the iterations bought."""
    conds, rows = data["conditions"], data["rows"]
    head = ["model", "parameters"]
    if "iters" in conds:
        head += [f"{data['settings']['iters']} iterations: val loss", "corpus words"]
    if "time" in conds:
        head += [f"equal time ({conds['time']['budget_s']:.3g} s): iterations", "val loss", "corpus words"]
    body = []
    for name in data["settings"]["models"]:
        params = next(r["params"] for r in rows if r["model"] == name)
        line = [data["model_labels"][name], f"{params:,}"]
        if "iters" in conds:
            line += cells(rows, name, conds["iters"]["iters"][name])
        if "time" in conds:
            n = conds["time"]["iters"][name]
            ms = 1000 * conds["time"]["calibration"]["models"][name]["s_per_iter"]
            line += [f"{n} ({ms:.0f} ms each)", *cells(rows, name, n)]
        body.append(line)
    seeds = data["settings"]["seeds"]
    note = f"Mean (min–max) over seeds {', '.join(map(str, seeds))}. " if len(seeds) > 1 else f"Seed {seeds[0]}. "
    note += ("Val loss: every token of val (evaluate.py); corpus words: the share of runs of 4+ ASCII letters in "
             "sample.py's three default samples that occur as whole words in train.bin.")
    c = data["counting"]["val_loss"]
    note += (f" Counting models (add-{data['counting']['alpha']} smoothing) score {c['2']:.3f} from the current "
             f"character, {c['3']:.3f} from the last two and {c['4']:.3f} from the last three.")
    if "time" in conds:
        cal, ref = conds["time"]["calibration"], data["settings"]["time_ref"]
        loads = [x["load"][0] for x in cal["loads"]]
        note += (f" Equal time: {data['settings']['iters']} iterations of {ref} at its calibrated s/iter "
                 f"(`--calibrate`, {cal['date']}, {cal['rounds']} interleaved round(s), load average "
                 f"{min(loads):.1f}–{max(loads):.1f}).")
    return table(head, body) + "\n\n" + textwrap.fill(note.strip(), 96, break_on_hyphens=False) + "\n"


TABLES = {"pydocs_compare": ("results/compare/pydocs_cpu.json", compare_table)}
FIELDS = {"results/compare/pydocs_cpu.json": ("the JSON of python results/compare/pydocs.py --out",
                                      ("settings", "counting", "conditions", "rows"))}  # for results/render.py
