"""
The ListOps tables of lra/README.md and README.md: functions that turn lra/results_listops.json
(written by `python lra/listops_runs.py`) into markdown, registered in TABLES for
results/render.py (`python results/render.py` rewrites them, `--check` compares). Accuracies
are test accuracy (%) at the best validation step. Standard library only.
"""

from results.markdown import table

RESULTS = "lra/results_listops.json"
MODELS = {"tssa": "ToST", "softmax": "softmax Transformer", "linear": "linear-attention Transformer"}


def grid_or_note(data, name):
    """The grid's record, or a line saying why there is none to show."""
    grid = data.get("grids", {}).get(name)
    if grid is None:
        return None, f"_No {name} runs in `{RESULTS}`: `python lra/listops_runs.py --out={RESULTS} --grids={name}` writes them._"
    if not grid.get("complete"):
        return None, f"_The {name} runs in `{RESULTS}` stopped before the end: run `{grid['command']}` again._"
    return grid, None


def by_run(grid):
    """run name -> its records, in the order they ran."""
    out = {}
    for r in grid["runs"]:
        out.setdefault(r["run"], []).append(r)
    return out


def config_cell(r):
    """The run's config file and extra settings, as they were given to lra/train.py."""
    words = r["command"].split()[2:]  # after "python lra/train.py"
    shown = [w.replace("lra/configs/", "") for w in words if not w.startswith(("--seed=", "--max_iters="))]
    return "`" + " ".join(shown) + "`"


def lr_text(lr):
    """A learning rate as the configs write it: 1e-3, 4e-3."""
    return f"{lr:.0e}".replace("e-0", "e-")


def mean(values):
    return sum(values) / len(values)


def seeds_cell(records, key):
    return " / ".join(f"{r[key]:.2f}" for r in sorted(records, key=lambda r: r["seed"]))


def provenance(grid, runs):
    """Where, with what and at what load the runs were measured, and the command."""
    loads = [r["load_average_before"][0] for r in runs]
    commit = (grid.get("commit") or "unknown")[:8] + (" with uncommitted changes" if grid.get("dirty") else "")
    smoke = f", max_iters cut to {grid['max_iters_override']} (a smoke run)" if grid.get("max_iters_override") else ""
    return (f"Written by `{grid['command']}`: {len(runs)} runs, one at a time on one thread, {grid['wall_s']} s in "
            f"all, at load average {min(loads):.1f} to {max(loads):.1f} (the machine was shared); {grid['cpu']}, "
            f"torch {grid['torch']}, commit {commit}, {grid['date']} UTC{smoke}. Data: `{grid['data']['command']}`.")


def table_listops_tiny(data):
    """Tiny ListOps: every attention in one shared config and the per-task softmax config, 3
    seeds on this CPU's own vector path, and all seeds on every vector path (the rounding spread)."""
    grid, note = grid_or_note(data, "tiny")
    if note:
        return note
    first = next(iter(grid["vector_paths"]))  # the seeds columns: this path ("native": the CPU's own)
    paths = ", ".join(f"{p} ({cap})" for p, cap in grid["vector_paths"].items())
    rows, spread, means = [], (0.0, None), []
    for name, records in by_run(grid).items():
        own = [r for r in records if r["vector_path"] == first]
        tests = [r["test_acc_at_best_val"] for r in records]
        r0 = records[0]
        means.append(mean(tests))
        rows.append([config_cell(r0), MODELS[r0["attn"]], f"{r0['params']:,}", f"{r0['iters']} x {r0['batch_size']}",
                     seeds_cell(own, "test_acc_at_best_val"), f"{mean([r['test_acc_at_best_val'] for r in own]):.1f}",
                     f"{mean(tests):.1f} ({min(tests):.2f}-{max(tests):.2f})"])
        for seed in {r["seed"] for r in records}:
            same = [r["test_acc_at_best_val"] for r in records if r["seed"] == seed]
            if max(same) - min(same) > spread[0]:
                spread = (max(same) - min(same), f"{MODELS[r0['attn']]}, `{config_cell(r0)[1:-1]}`, seed {seed}")
    d = grid["data"]
    n_seeds = len({r["seed"] for r in grid["runs"]})
    head = ["configuration", "model", "parameters", "steps x batch",
            f"test, seeds {' / '.join(str(s) for s in sorted({r['seed'] for r in grid['runs']}))}", "mean",
            f"all {n_seeds * len(grid['vector_paths'])} runs: mean (min-max)"]
    majority = f"majority class (label {d['majority_label']})"
    rows.append([majority, "", "", "", "", f"{d['majority_acc']['test']:.1f}", ""])
    split = d["splits"]
    text = (table(head, rows) + "\n\n"
            f"Data: {split['train']['n']:,} / {split['val']['n']:,} / {split['test']['n']:,} examples, "
            f"{split['train']['min_tokens']}-{split['train']['max_tokens']} tokens (mean "
            f"{split['train']['mean_tokens']}) in training. The seeds columns ran on the {first} vector path "
            f"({grid['vector_paths'][first]}); \"all runs\" adds every seed on each of PyTorch's vector paths "
            f"({paths}). ")
    if spread[1]:
        text += (f"The same seed moves by up to {spread[0]:.2f} points between vector paths ({spread[1]}), a "
                 f"difference in rounding alone; the models' means over all runs span {max(means) - min(means):.2f} "
                 "points. ")
    return text + provenance(grid, grid["runs"])


def table_listops_mini(data):
    """Mini ListOps: deeper, longer trees; ToST at two learning rates and the softmax partner."""
    grid, note = grid_or_note(data, "mini")
    if note:
        return note
    seeds = sorted({r["seed"] for r in grid["runs"]})
    rows = []
    for name, records in by_run(grid).items():
        r0 = records[0]
        rows.append([config_cell(r0), f"{MODELS[r0['attn']]}, lr {lr_text(r0['learning_rate'])}", f"{r0['params']:,}",
                     f"{r0['iters']} x {r0['batch_size']}", seeds_cell(records, "best_val_acc"),
                     seeds_cell(records, "test_acc_at_best_val"),
                     f"{mean([r['test_acc_at_best_val'] for r in records]):.1f}"])
    d = grid["data"]
    split = d["splits"]
    seeds_txt = " / ".join(map(str, seeds))
    rows.append([f"majority class (label {d['majority_label']})", "", "", "", f"{d['majority_acc']['val']:.1f}",
                 f"{d['majority_acc']['test']:.1f}", ""])
    head = ["configuration", "model", "parameters", "steps x batch", f"best val, seeds {seeds_txt}",
            f"test, seeds {seeds_txt}", "test mean"]
    return (table(head, rows) + "\n\n"
            f"Data: {split['train']['n']:,} / {split['val']['n']:,} / {split['test']['n']:,} examples, "
            f"{split['train']['min_tokens']}-{split['train']['max_tokens']} tokens (mean "
            f"{split['train']['mean_tokens']}) in training; this CPU's own vector path "
            f"({grid['vector_paths'].get('native', '?')}). " + provenance(grid, grid["runs"]))


def table_listops_summary(data):
    """README.md's line: the tiny shared-config ListOps, every run of each model."""
    grid, note = grid_or_note(data, "tiny")
    if note:
        return note
    rows = []
    for name, records in by_run(grid).items():
        tests = [r["test_acc_at_best_val"] for r in records]
        r0 = records[0]
        rows.append([MODELS[r0["attn"]], config_cell(r0), f"{r0['params']:,}",
                     f"{mean(tests):.1f} ({min(tests):.1f}-{max(tests):.1f})"])
    seeds, paths = len({r["seed"] for r in grid["runs"]}), len(grid["vector_paths"])
    rows.append(["majority class", "", "", f"{grid['data']['majority_acc']['test']:.1f}"])
    head = ["model", "configuration", "parameters", f"test accuracy %, {seeds * paths} runs: mean (min-max)"]
    return (table(head, rows) + "\n\n"
            f"{seeds} seeds x {paths} CPU vector paths each, from `{RESULTS}` (`{grid['command']}`).")


TABLES = {"lra_listops_tiny": (RESULTS, table_listops_tiny), "lra_listops_mini": (RESULTS, table_listops_mini),
          "lra_listops_summary": (RESULTS, table_listops_summary)}
FIELDS = {RESULTS: ("the JSON of python lra/listops_runs.py", ("schema", "grids"))}  # for results/render.py
