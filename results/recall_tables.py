"""
results/recall/README.md's tables (and the recall summary of README.md), rendered from the JSON the
recall commands write: every figure in those tables comes from that JSON, by these functions.

    results/recall/results_cpu.json             python results/recall/suite.py --out_json=results/recall/results_cpu.json ...
    results/recall/decode_cpu.json              python results/recall/decode_bench.py --out=results/recall/decode_cpu.json
(the commands in full: results/recall/README.md, beside the tables)

TABLES maps a table's NAME to (its JSON, relative to the repository; fn(data) -> markdown).
A document holds the table between `<!-- table: NAME -->` and `<!-- /table -->`;
results/render.py rewrites or checks those blocks. results/recall/suite.py prints SUITE_TABLES from
its own JSON at the end of a run. Standard library only.
"""

import textwrap

from results.markdown import spread, table

SUITE_JSON = "results/recall/results_cpu.json"
DECODE_JSON = "results/recall/decode_cpu.json"
TASK_NAMES = {"mqar": "MQAR", "copy": "copy", "niah": "needle"}


ACC = "{:.3f}"  # an accuracy as the tables write it


def acc(x):
    return ACC.format(x)


def rate(lr):
    """A learning rate as it is written: 3e-4, 1e-3, 2.5e-3."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def paragraph(text, width=100):
    """Markdown text wrapped at `width` columns (a paragraph reads the same)."""
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False))


def score(run):
    """A run's score: its test accuracy (niah: at its longest length)."""
    return run["acc"][max(run["acc"], key=int)]


def model_order(data):
    """The models of the runs, in the suite's order (data['labels'])."""
    present = {r["model"] for r in data["runs"]}
    return [m for m in data["labels"] if m in present]


def best_rows(data, task, recipe=None):
    """One row per (recipe, model) with a selected rate: the runs of `task` at that rate, by
    seed -- dict(recipe, model, lr, seeds, accs, steps, state_bytes, params)."""
    rows = []
    for rec in data["recipes"]:
        if recipe not in (None, rec):
            continue
        for model in model_order(data):
            lr = data["selected"].get(rec, {}).get(model)
            runs = sorted((r for r in data["runs"] if (r["recipe"], r["model"], r["task"], r["lr"]) ==
                           (rec, model, task, lr)), key=lambda r: r["seed"])
            if lr is None or not runs:
                continue
            rows.append(dict(recipe=rec, model=model, lr=lr, seeds=[r["seed"] for r in runs],
                             accs=[score(r) for r in runs], steps=[r["steps"] for r in runs],
                             state_bytes=runs[0]["state_bytes_per_layer"], params=runs[0]["params"]))
    return rows


def mqar_setting(data):
    s = data["settings"]
    return f"K={s['mqar_pairs']} pairs, {s['mqar_queries']} queries, T={data['lengths']['mqar'][0]}"


def recipe_text(data, rec):
    r = data["recipes"][rec]
    head = "untied head N(0, 0.02)" if not r["tied_head"] else "head tied to the embeddings"
    return f"weight decay {r['weight_decay']:g}, {head}, embeddings N(0, {r['embed_init']:g})"


def caption(data, recipes):
    """The recipe and protocol beside the numbers, from the JSON's settings."""
    s, swept = data["settings"], data["swept"]
    runs = [r for r in data["runs"] if r["recipe"] in recipes]
    lrs = sorted({r["lr"] for r in runs if r["task"] == swept and r["seed"] == 0})
    seeds = sorted({r["seed"] for r in runs if r["task"] == swept})
    hours = sum(r["train_s"] for r in runs) / 3600
    loads = [r["load"] for r in runs]
    sched = "constant" if s["lr_schedule"] == "constant" else "cosine to rate / 10"
    batches = ", ".join(f"{TASK_NAMES[t]} {s[t + '_batch']} x at most {s[t + '_steps']:,} steps"
                        for t in data["lengths"] if any(r["task"] == t for r in runs))
    text = (f"Recipe: {plural(s['n_layer'], 'layer')}, width {s['n_embd']}, {s['n_head']} heads, MLP 4x, no layer scale; "
            f"AdamW (0.9, {s['beta2']:g}), gradient clip {s['grad_clip']:g}, warmup {s['warmup_steps']} steps "
            f"then {sched}; batch {batches}, stopping once the validation accuracy ({s['val_examples']} "
            f"held-out sequences, every {s['eval_interval']} steps) reaches {s['early_stop']:g}. "
            + " ".join(f"**{rec}**: {recipe_text(data, rec)}." for rec in recipes)
            + f" The rate is selected on seed 0's validation accuracy among {', '.join(map(rate, lrs))}; "
            f"seeds {', '.join(map(str, seeds[1:])) or '(none)'} then run at that rate (selection on one seed). "
            f"Accuracy on the query tokens of {s['eval_examples']:,} test sequences no run trains or selects on. "
            f"{len(runs)} runs, {hours:.1f} h of training on {s['device'].upper()}, {s['num_threads']} thread "
            f"each, load average {min(loads):.1f}–{max(loads):.1f} at their ends.")
    return paragraph(text)


def table_recipe(data, rec):
    """One recipe: the selected rate of each model, the swept task over the seeds, the other
    tasks at that rate (seed 0), the state bytes per layer."""
    swept, lengths = data["swept"], data["lengths"]
    rows = best_rows(data, swept, rec)
    if not rows:
        return f"_No runs of the {rec} recipe in this file._"
    others = [t for t in lengths if t != swept and any(r["task"] == t and r["recipe"] == rec for r in data["runs"])]
    n_seeds = max(len(r["seeds"]) for r in rows)
    head = ["model", "params", "state / layer (bytes)", "rate",
            f"{TASK_NAMES[swept]} ({mqar_setting(data) if swept == 'mqar' else swept}), {plural(n_seeds, 'seed')}",
            "steps (each seed)"]
    cols = [(t, T) for t in others for T in lengths[t]]
    head += [f"{TASK_NAMES[t]} (T={T})" for t, T in cols]
    out = []
    for row in rows:
        cells = [data["labels"][row["model"]], f"{row['params']:,}", f"{row['state_bytes']:,.0f}", rate(row["lr"]),
                 spread(row["accs"], ACC), " / ".join(f"{n:,}" for n in row["steps"])]
        for t, T in cols:
            run = next((r for r in data["runs"] if (r["recipe"], r["model"], r["task"], r["lr"], r["seed"]) ==
                        (rec, row["model"], t, row["lr"], 0)), None)
            cells.append("-" if run is None else acc(run["acc"][str(T)]))
        out.append(cells)
    chance = ", ".join(f"{TASK_NAMES[t]} {data['chance'][t]:.3f}" for t in [swept] + others)
    return table(head, out) + "\n\n" + paragraph(f"Chance: {chance}. " + caption(data, [rec]))


def table_sweep(data):
    """Seed 0 at every rate: the test accuracy and the steps it trained; the selected rate bold."""
    swept = data["swept"]
    lrs = sorted({r["lr"] for r in data["runs"] if r["task"] == swept and r["seed"] == 0})
    out = []
    for rec in data["recipes"]:
        for model in model_order(data):
            cells = [rec, data["labels"][model]]
            for lr in lrs:
                run = next((r for r in data["runs"] if (r["recipe"], r["model"], r["task"], r["lr"], r["seed"]) ==
                            (rec, model, swept, lr, 0)), None)
                text = "-" if run is None else f"{acc(score(run))} ({run['steps']:,})"
                chosen = data["selected"].get(rec, {}).get(model) == lr
                cells.append(f"**{text}**" if chosen and run else text)
            if any(c != "-" for c in cells[2:]):
                out.append(cells)
    if not out:
        return "_No sweep runs in this file._"
    head = ["recipe", "model"] + [f"rate {rate(lr)}" for lr in lrs]
    return table(head, out) + "\n\n" + paragraph(
        f"{TASK_NAMES[swept]} test accuracy of seed 0 (steps trained); bold: the rate selected (best validation "
        "accuracy; ties: fewer steps, then the smaller rate).")


def table_summary(data):
    """For README.md: each model's best-rate accuracy under both recipes, beside its state."""
    swept = data["swept"]
    recipes = [rec for rec in data["recipes"] if best_rows(data, swept, rec)]
    by = {(r["recipe"], r["model"]): r for r in best_rows(data, swept)}
    out = []
    for model in model_order(data):
        rows = [by.get((rec, model)) for rec in recipes]
        if not any(rows):
            continue
        state = next(r for r in rows if r)["state_bytes"]
        out.append([data["labels"][model], f"{state:,.0f}"] +
                   ["-" if r is None else f"{spread(r['accs'], ACC)} at rate {rate(r['lr'])}" for r in rows])
    if not out:
        return "_No runs in this file._"
    n_seeds = max(len(r["seeds"]) for r in by.values())
    head = ["model", "decoding state / layer (bytes)"] + [f"{TASK_NAMES[swept]}, {rec} recipe" for rec in recipes]
    s = data["settings"]
    lrs = sorted({r["lr"] for r in data["runs"] if r["task"] == swept and r["seed"] == 0})
    return table(head, out) + "\n\n" + paragraph(
        f"{TASK_NAMES[swept]} ({mqar_setting(data) if swept == 'mqar' else swept}; chance "
        f"{data['chance'][swept]:.3f}), {plural(s['n_layer'], 'layer')} of width {s['n_embd']}: accuracy at the "
        f"best of {plural(len(lrs), 'rate')} (selected on seed 0), mean (min–max) of {plural(n_seeds, 'seed')}; "
        "the recipes: results/recall/README.md.")


def table_decode(data):
    """Decoding cost per variant: state bytes after T tokens and milliseconds per token."""
    lengths = sorted({r["T"] for r in data["rows"]})
    variants = list(dict.fromkeys(r["variant"] for r in data["rows"]))
    labels = data.get("labels", {})
    cell = {(r["variant"], r["T"]): r for r in data["rows"]}
    out = []
    for v in variants:
        sizes = [cell[(v, T)]["state_bytes_per_sequence"] for T in lengths if (v, T) in cell]
        size = f"{sizes[0]:,} (every T)" if len(set(sizes)) == 1 else " / ".join(f"{b:,}" for b in sizes)
        ms = " / ".join(f"{cell[(v, T)]['ms_per_token']:.1f}" for T in lengths if (v, T) in cell)
        out.append([labels.get(v, v), cell[(v, lengths[0])].get("n_layer", "-"), size, ms])
    Ts = " / ".join(f"{T:,}" for T in lengths)
    s, load = data["settings"], data["loadavg"]
    return table(["variant", "layers", f"state after {Ts} tokens (bytes)", f"ms per token ({Ts})"], out) + "\n\n" + paragraph(
        f"One sequence, {s['steps']} tokens decoded after the prompt, median of {s['repeats']} repeats, "
        f"{plural(s['num_threads'], 'thread')}; load average {load[0]:.1f} at the end (torch {data['torch']}).")


TABLES = {
    "recall_summary": (SUITE_JSON, table_summary),
    "recall_tuned": (SUITE_JSON, lambda data: table_recipe(data, "tuned")),
    "recall_plain": (SUITE_JSON, lambda data: table_recipe(data, "plain")),
    "recall_sweep": (SUITE_JSON, table_sweep),
    "recall_decode": (DECODE_JSON, table_decode),
}
SUITE_TABLES = ("recall_sweep", "recall_tuned", "recall_plain", "recall_summary")
FIELDS = {SUITE_JSON: ("the JSON of python results/recall/suite.py", ("runs", "selected", "swept", "settings", "labels",
                                                             "recipes", "chance", "lengths")),
          DECODE_JSON: ("the JSON of python results/recall/decode_bench.py", ("rows", "settings", "loadavg", "torch"))}
