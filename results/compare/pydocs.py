"""
The first screen's comparison, measured: character-level language models on the embedded
corpus at the budget of the README's first command (1200 iterations of 16 x 128 characters,
width 96, one thread), 3 seeds each, at equal iterations and at equal wall time. For every run:
the val loss on every token of val (evaluate.py) and the share of corpus words in sample.py's
three default samples (runs of 4+ ASCII letters that occur as whole words in train.bin's text).

    python prepare_char.py
    python results/compare/pydocs.py --calibrate                # s/iter of each model -> out-compare/pydocs/calibration.json
    python results/compare/pydocs.py --calibrate --calibration=results/compare/pydocs_calibration.json   # the committed one
    python results/compare/pydocs.py --out=results/compare/pydocs_cpu.json   # both conditions x 3 seeds: JSON, table, figure
    python results/compare/pydocs.py --quick                         # the whole path on a tiny ToST (a smoke test)

Equal wall time is made reproducible: the calibration step times every model in the same
conditions (short train.py runs, one thread, interleaved round by round, the load recorded),
and the equal-time condition then trains each model for budget / (its s/iter) iterations on its
own schedule, a deterministic command (budget: `iters` iterations of `time_ref`). The committed
calibration fixes those counts, so the table reproduces on any machine; --calibrate measures
again (on a quiet machine: the ratios are what matter), into out_root/calibration.json unless
--calibration names the file (the committed one only when named); the models it does not
measure keep their entries there (when taken on this machine with the same settings), and
runs whose count changed run again.

Every run is `train.py <config> <the model's settings> --seed=S --max_iters=N --lr_decay_iters=N`
(one thread, one run at a time), then evaluate.py and sample.py on its out_dir, all under
out_root. Finished runs are kept in out_root/results.json: the same command continues where it
stopped, and the JSON named by --out (with a figure beside it) is written only when named.
"""

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch

# the repository's modules
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from results import pydocs_tables  # noqa: E402
from nanotost import REPO, atomic, checkpoints, cli, outputs, plots, portable  # noqa: E402
from nanotost import textdata as td  # noqa: E402

# -----------------------------------------------------------------------------
models = "tost,tost_conv,softmax,linear,hybrid_conv"  # which of MODELS, in the table's order
seeds = "1337,1338,1339"  # 1337: the first screen's run
conditions = "iters,time"  # "iters": every model `iters` iterations; "time": the same seconds each
iters = 1200  # the first screen's budget (config/pydocs_char_tost.py)
time_ref = "tost"  # the equal-time budget: `iters` iterations of this model, at its calibrated s/iter
calibrate = False  # measure s/iter of every model into `calibration`, and stop
calib_iters = 60  # iterations of each calibration run ...
calib_skip = 10  # ... of which the first are not timed (warm-up)
calib_rounds = 3  # rounds over the models (interleaved)
calibration = "results/compare/pydocs_calibration.json"  # the s/iter the equal-time condition uses (--calibrate: when named)
out_root = "out-compare/pydocs"  # every run's out_dir, and results.json (the finished runs)
out = ""  # the JSON to write (and a .png figure beside it); "": print the table only
data_dir = "data"  # the character-level dataset every model trains on (prepare_char.py)
dataset = "pydocs_char"
quick = False  # a tiny ToST, 1 seed, 8 iterations: the whole path, its own files (a smoke test)
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())
CONFIG_DATA = dict(data_dir="data", dataset="pydocs_char")  # what the configs train on
COUNTING_ALPHA = 0.1  # add-alpha smoothing of the counting models (the reference rows)
# model -> (what the table calls it, config file, settings added). 6 ToST layers have the
# parameters of 5 softmax layers (TSSA has one C x C input map where softmax has three)
MODELS = {
    "tost": ("ToST, the paper's layer", "config/pydocs_char_tost.py", ["--short_conv=0"]),
    "tost_conv": ("ToST + short conv (k=4)", "config/pydocs_char_tost.py", ["--short_conv=4"]),
    "softmax": ("softmax attention (GPT-2)", "config/pydocs_char_softmax.py", []),
    "linear": ("linear attention", "config/pydocs_char_softmax.py", ["--attn=linear"]),
    "hybrid_conv": ("hybrid (softmax in blocks 2, 4, 6) + short conv", "config/pydocs_char_tost.py",
                    ["--hybrid_every=2", "--short_conv=4"]),
}
# --quick: tiny models and runs (each a few seconds, most of it starting Python)
QUICK_MODEL = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=32", "--batch_size=4", "--warmup_iters=2"]
QUICK = dict(iters=8, calib_iters=6, calib_skip=2, calib_rounds=1, seeds="1337", models="tost",
             out_root="out-compare/quick")
QUICK_EVAL, QUICK_SAMPLE_TOKENS = ["--max_tokens=2000"], 60
SAMPLE_DEFAULTS = dict(start="\n", num_samples=3, max_new_tokens=500)  # sample.py's (the samples parsed below)

# -----------------------------------------------------------------------------
# the share of corpus words: runs of 4+ ASCII letters that occur as whole words in the corpus

LETTERS = re.compile(r"[A-Za-z]+")  # a word: a maximal run of ASCII letters (case kept)


def corpus_words(text):
    """Every whole word of a text (maximal runs of ASCII letters), as a set."""
    return set(LETTERS.findall(text))


def word_share(samples, words, min_len=4):
    """(corpus words, words) over the samples: the runs of min_len+ ASCII letters, and how many
    of them are in `words` exactly (case counts: "Return" is not "return")."""
    found = [w for text in samples for w in LETTERS.findall(text) if len(w) >= min_len]
    return sum(w in words for w in found), len(found)


def splits(data_dir, dataset):
    """train.bin and val.bin of a character-level dataset (token ids), and its meta.json."""
    folder, meta = td.open_dataset(data_dir, dataset, ("train", "val"), 1)
    cli.require(meta["tokenizer"] == "char", f"dataset {dataset!r} is not character-level: prepare it with "
                                             "prepare_char.py")
    return [np.fromfile(os.path.join(folder, f"{s}.bin"), dtype=np.uint16).astype(np.int64)
            for s in ("train", "val")] + [meta]


def counting_loss(train, val, order, V, alpha=COUNTING_ALPHA):
    """Val loss of a counting model that predicts each character from the order - 1 before it
    (add-alpha smoothing over the V characters): what that much context is worth on this data."""
    def keys(ids):  # (context as one integer, next character) at every position with a full context
        ctx = np.zeros(len(ids) - order + 1, dtype=np.int64)
        for i in range(order - 1):
            ctx = ctx * V + ids[i:len(ids) - order + 1 + i]
        return ctx, ids[order - 1:]

    def count(table, query):  # how often each query occurs in `table` (sorted keys, counts)
        at = np.searchsorted(table[0], query).clip(max=len(table[0]) - 1)
        return np.where(table[0][at] == query, table[1][at], 0)

    ctx, nxt = keys(train)
    pairs, contexts = np.unique(ctx * V + nxt, return_counts=True), np.unique(ctx, return_counts=True)
    vctx, vnxt = keys(val)
    p = (count(pairs, vctx * V + vnxt) + alpha) / (count(contexts, vctx) + alpha * V)
    return float(-np.log(p).mean())


# -----------------------------------------------------------------------------
# one run: train.py, then evaluate.py and sample.py on its out_dir


def recipe(name, cfg):
    """The train.py arguments that define model `name`'s run, but for seed, length and out_dir."""
    _, config, extra = MODELS[name]
    data = [f"--{k}={getattr(cfg, k)}" for k, v in CONFIG_DATA.items() if getattr(cfg, k) != v]  # (none by default)
    return [config, *extra, *(QUICK_MODEL if cfg.quick else []), "--eval_iters=1", "--num_threads=1", *data]


def recipe_id(name, cfg):
    """A short hash of the settings a run of model `name` trains with (its config file's values,
    then the recipe's --key=value): results made with other settings are never reused."""
    config, *args = recipe(name, cfg)
    scope = {}
    with open(os.path.join(REPO, config), encoding="utf-8") as f:
        exec(f.read(), scope)  # a config file: plain `key = value` lines
    settings = {k: v for k, v in scope.items() if isinstance(v, (int, float, bool, str)) and not k.startswith("_")}
    settings.update(arg[2:].split("=", 1) for arg in args)
    settings.pop("out_dir")
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def length_args(n):
    """`n` iterations on a schedule of its own length; the only evaluations at the start and the end."""
    return [f"--max_iters={n}", f"--lr_decay_iters={n}", f"--eval_interval={n}"]


def run(args, log_path, what):
    """Run a script of the repository (one line on failure, pointing at its output); its stdout."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ python {' '.join(args)}\n")
        log.flush()
        proc = subprocess.run([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        log.write(proc.stdout)
    if proc.returncode != 0:
        last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise cli.UserError(f"{what} failed (exit {proc.returncode}): {last[:200]}; its output: {log_path}")
    return proc.stdout


def parse_samples(stdout, n, length):
    """The n samples sample.py printed, each `length` characters, between lines of 60 dashes.
    Cut by length (a character-level sample may itself hold a line of dashes)."""
    rule = "-" * 60 + "\n"
    at = stdout.index(rule)
    out = []
    for _ in range(n):
        at += len(rule)
        out.append(stdout[at:at + length])
        at += length + 1  # the newline print adds
        if stdout[at:at + len(rule)] != rule:
            raise RuntimeError(f"sample.py's output is not {n} samples of {length} characters:\n{stdout[:2000]}")
    return out


def train_and_score(name, seed, n, cfg, words):
    """Train model `name` for n iterations with `seed` (continuing an interrupted run), score it:
    one row of results."""
    run_dir = os.path.join(cfg.out_root, f"{name}_s{seed}_i{n}_{recipe_id(name, cfg)}")
    log_path = run_dir + ".out"
    train = ["train.py", *recipe(name, cfg), f"--seed={seed}", *length_args(n), f"--out_dir={run_dir}"]
    evaluate = ["evaluate.py", f"--out_dir={run_dir}", f"--data_dir={cfg.data_dir}", f"--dataset={cfg.dataset}",
                "--num_threads=1", *(QUICK_EVAL if cfg.quick else [])]
    sample = ["sample.py", f"--out_dir={run_dir}", *([f"--max_new_tokens={QUICK_SAMPLE_TOKENS}"] if cfg.quick else [])]
    load_before, t0 = portable.load_average(), time.time()
    run(train, log_path, f"training {name} (seed {seed}, {n} iterations)")
    wall_s, load_after = time.time() - t0, portable.load_average()
    run(evaluate, log_path, f"evaluating {name}")
    with open(os.path.join(run_dir, "eval.jsonl"), encoding="utf-8") as f:
        scored = json.loads(f.read().splitlines()[-1])
    length = len(SAMPLE_DEFAULTS["start"]) + (QUICK_SAMPLE_TOKENS if cfg.quick else SAMPLE_DEFAULTS["max_new_tokens"])
    samples = parse_samples(run(sample, log_path, f"sampling {name}"), SAMPLE_DEFAULTS["num_samples"], length)
    hits, total = word_share(samples, words)
    step_s, ckpt = step_seconds(run_dir)
    return dict(model=name, seed=seed, iters=n, params=sum(v.numel() for k, v in ckpt["model"].items()
                                                           if k != "lm_head.weight"),  # the tied head once
                val_loss=round(scored["loss"], 4), val_tokens=scored["tokens"], corpus_words=hits, words=total,
                share=round(hits / max(total, 1), 4), train_wall_s=round(wall_s, 1),
                s_per_iter=round(float(np.median(step_s)), 4), load=[round(x, 2) for x in load_before + load_after],
                samples=samples,
                commands=[" ".join(["python", *args]) for args in (train, evaluate, sample)])


def step_seconds(run_dir, skip=0):
    """The step times (s) train.py logged for its iterations from `skip` on, and its checkpoint."""
    ckpt = checkpoints.load_checkpoint(run_dir, "language")
    c = ckpt["config"]
    tokens = c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]  # per iteration
    with open(os.path.join(run_dir, "log.jsonl"), encoding="utf-8") as f:
        steps = [r for r in map(json.loads, f) if r.get("tokens_per_s") and r["iter"] >= skip]
    return [tokens / r["tokens_per_s"] for r in steps], ckpt


# -----------------------------------------------------------------------------
# the calibration: seconds per iteration of every model, in the same conditions


def calibrate_models(names, cfg):
    """Short train.py runs of every model, round by round (the order reversed every other
    round), one thread each; s/iter: the median step time over every timed step of its runs."""
    times, per_round, loads = {m: [] for m in names}, {m: [] for m in names}, []
    for r in range(cfg.calib_rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            run_dir = os.path.join(cfg.out_root, "calibration", f"{name}_r{r}")
            for f in ("ckpt.pt", "log.jsonl"):  # what train.py wrote there in an earlier calibration, alone
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(run_dir, f))
            args = ["train.py", *recipe(name, cfg), *length_args(cfg.calib_iters), "--log_interval=1",
                    f"--out_dir={run_dir}", "--init_from=scratch"]
            before = portable.load_average()
            run(args, run_dir + ".out", f"the calibration run of {name}")
            loads.append(dict(model=name, round=r, load=[round(x, 2) for x in before + portable.load_average()]))
            step_s, _ = step_seconds(run_dir, cfg.calib_skip)
            times[name] += step_s
            per_round[name].append(round(float(np.median(step_s)), 5))
            print(f"  {name} round {r}: {1000 * per_round[name][-1]:.1f} ms/iter (load {loads[-1]['load'][0]:.2f})",
                  flush=True)
    return {m: dict(s_per_iter=round(float(np.median(times[m])), 5), rounds=per_round[m], recipe_id=recipe_id(m, cfg),
                    recipe=recipe(m, cfg)) for m in names}, loads


def machine():
    """What the timings were taken on."""
    cpu = ""
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return dict(cpu=cpu, cores=os.cpu_count(), torch=torch.__version__, python=sys.version.split()[0])


def uncalibrated(cal, names, cfg):
    """The models (of `names` and time_ref) that a calibration lacks, or measured with other settings."""
    return [m for m in dict.fromkeys(names + [cfg.time_ref])
            if cal is None or cal["models"].get(m, {}).get("recipe_id") != recipe_id(m, cfg)]


def equal_time_iters(cal, names, cfg):
    """Iterations per model for the equal-time condition: budget / (its s/iter), the budget being
    `iters` iterations of time_ref. Refuses a calibration of other models or other settings."""
    missing = uncalibrated(cal, names, cfg)
    if missing:
        raise cli.UserError(f"{cfg.calibration} has no calibration of {', '.join(missing)} with these settings: "
                            "measure one with python results/compare/pydocs.py --calibrate (and the same settings)")
    budget = cfg.iters * cal["models"][cfg.time_ref]["s_per_iter"]
    return budget, {m: max(1, round(budget / cal["models"][m]["s_per_iter"])) for m in names}


# -----------------------------------------------------------------------------
# the figure


def figure_png(data):
    """Val loss and corpus-word share per model, each seed a dot, both conditions side by side."""
    plt = plots.pyplot()

    names = data["settings"]["models"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key, label in ((axes[0], "val_loss", "val loss (every val token)"),
                           (axes[1], "share", "share of corpus words in samples")):
        for shift, (cond, marker) in zip((-0.15, 0.15), (("iters", "o"), ("time", "^"))):
            if cond not in data["conditions"]:
                continue
            counts = data["conditions"][cond]["iters"]
            ax.scatter([], [], marker=marker, color="gray", label=pydocs_tables.CONDITION_LABELS[cond])
            for i, name in enumerate(names):
                ys = [r[key] for r in data["rows"] if r["model"] == name and r["iters"] == counts[name]]
                ax.scatter([i + shift] * len(ys), ys, marker=marker, s=18, color=f"C{i}")
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    seeds = len(data["settings"]["seeds"])
    fig.suptitle(f"character level, the first screen's budget: {seeds} seed(s) per model (dots)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# -----------------------------------------------------------------------------


def check_settings(cfg):
    """Every setting checked before any run; lists parsed."""
    cfg.names = cli.name_list("models", cfg.models, tuple(MODELS))
    cli.require(cfg.time_ref in MODELS, f"unknown model {cfg.time_ref!r}: choose from {', '.join(MODELS)}")
    cfg.seed_list = cli.seed_list("seeds", cfg.seeds)
    cfg.cond_list = cli.name_list("conditions", cfg.conditions, ("iters", "time"))
    cli.check(cfg, at_least_1=("iters", "calib_iters", "calib_rounds"), non_negative=("calib_skip",))
    cli.require(cfg.calib_skip < cfg.calib_iters, f"calib_skip ({cfg.calib_skip}) must be below calib_iters "
                                              f"({cfg.calib_iters}): some steps must be timed")
    cli.require(not cfg.out or cfg.out.endswith(".json"), f"out must be a .json file (the figure goes beside it), "
                                                      f"got {cfg.out!r}")


def claim_outputs(cfg, given):
    """Before any run: where --calibrate writes (C.calibration only when named: the committed file
    is never a default output), and every output claimed (one writer each; writable)."""
    if cfg.calibrate and "calibration" not in given and not cfg.quick:
        cfg.calibration = os.path.join(cfg.out_root, "calibration.json")
    if cfg.calibrate or cfg.quick:
        outputs.claim_output(cfg.calibration, "--calibration=<another file>")
    outputs.claim_output(os.path.join(cfg.out_root, "results.json"), "--out_root=<another folder>")
    for path in ([cfg.out, cfg.out[:-len(".json")] + ".png"] if cfg.out else []):
        outputs.claim_output(path, "--out=<another file>")


def take_calibration(cfg):
    """--calibrate (and --quick, when its own calibration is missing or stale): measure every
    model's s/iter and write it to C.calibration."""
    names = list(dict.fromkeys(cfg.names + [cfg.time_ref]))
    kept = calibrations_kept(cfg, names)
    print(f"calibrating {', '.join(names)}: {cfg.calib_rounds} round(s) of {cfg.calib_iters} iterations "
          f"(load {portable.load_average()[0]:.2f})", flush=True)
    models_cal, loads = calibrate_models(names, cfg)
    date = time.strftime("%Y-%m-%d %H:%M")
    for entry in models_cal.values():
        entry["date"] = date
    cal = dict(what="seconds per training iteration of each model (median step time of train.py, one thread)",
               command="python results/compare/pydocs.py --calibrate" + (" --quick" if cfg.quick else ""),
               date=date, machine=machine(), calib_iters=cfg.calib_iters, calib_skip=cfg.calib_skip,
               rounds=cfg.calib_rounds, models={**kept.get("models", {}), **models_cal},
               loads=kept.get("loads", []) + loads)
    atomic.write_json(cfg.calibration, cal)
    print(f"wrote {cfg.calibration}: " + ", ".join(f"{m} {1000 * v['s_per_iter']:.1f} ms" for m, v in models_cal.items())
          + (f"; kept {', '.join(m for m in kept.get('models', {}) if m not in models_cal)} from before"
             if set(kept.get("models", {})) - set(models_cal) else ""))
    if cfg.calibration != SETTINGS["calibration"]:
        print(f"the equal-time condition uses it with --calibration={cfg.calibration}")
    return cal


def calibrations_kept(cfg, names):
    """The calibration at C.calibration whose other models' entries --calibrate keeps ({} if none).
    Refused before any run when it was taken elsewhere or with other settings: one file, one machine."""
    old = read_calibration(cfg)
    others = sorted(set((old or {}).get("models", {})) - set(names))
    if not others:
        return old or {}
    same = old["machine"] == machine() and (old["calib_iters"], old["calib_skip"], old["rounds"]) == (
        cfg.calib_iters, cfg.calib_skip, cfg.calib_rounds)
    cli.require(same, f"{cfg.calibration} holds calibrations of {', '.join(others)} taken on another machine or with "
                      f"other settings, which a calibration of {', '.join(names)} here would sit beside: "
                      "calibrate them too (--models=...), or write this one elsewhere with --calibration=<new file>")
    return old


def read_calibration(cfg):
    """The calibration the equal-time condition uses (None if there is none), its fields checked."""
    if not os.path.isfile(cfg.calibration):
        return None
    fix = "restore it with git checkout, or measure one with python results/compare/pydocs.py --calibrate"
    cal = atomic.read_json(cfg.calibration, fix)
    with atomic.reading(cfg.calibration, fix):
        for name, entry in dict(cal["models"]).items():
            atomic.json_number(entry["s_per_iter"], f"models.{name}.s_per_iter", positive=True)
            _ = entry["recipe_id"]  # (present)
        for key in ("calib_iters", "calib_skip", "rounds"):
            atomic.json_number(cal[key], key)
        _ = dict(cal["machine"]), list(cal["loads"])  # (each of its type)
    return cal


def plan(cfg):
    """Each condition's iterations per model, and the runs they need: (model, seed, iterations),
    each once (time_ref's equal-time run is its equal-iteration run)."""
    conds = {}
    if "iters" in cfg.cond_list:
        conds["iters"] = dict(iters={m: cfg.iters for m in cfg.names})
    if "time" in cfg.cond_list:
        cal = read_calibration(cfg)
        cli.require(cal is not None, f"no calibration at {cfg.calibration}: measure one first with "
                                     "python results/compare/pydocs.py --calibrate")
        budget, counts = equal_time_iters(cal, cfg.names, cfg)
        conds["time"] = dict(iters=counts, budget_s=round(budget, 1), calibration=cal)
    todo = list(dict.fromkeys((m, s, c["iters"][m]) for c in conds.values() for s in cfg.seed_list for m in cfg.names))
    return conds, todo


def run_all(todo, cfg, words):
    """Every run of the plan, each recorded in out_root/results.json as soon as it is scored:
    the runs found there are not run again (the same command continues)."""
    done_path = os.path.join(cfg.out_root, "results.json")
    done = {}
    if os.path.isfile(done_path):
        done = atomic.read_json(done_path, f"move it away (its runs are then trained again), or choose another "
                                        f"--out_root")
        with atomic.reading(done_path, "move it away (its runs are then trained again), or choose another --out_root"):
            for key, r in done.items():  # what the table reads, each a number
                for field in ("val_loss", "iters", "share", "corpus_words", "words", "params"):
                    atomic.json_number(r[field], f"{key}.{field}")
    rows = []
    for i, (name, seed, n) in enumerate(todo):
        key = f"{name}_s{seed}_i{n}_{recipe_id(name, cfg)}"
        if key not in done:
            print(f"[{i + 1}/{len(todo)}] {name}, seed {seed}, {n} iterations (load {portable.load_average()[0]:.2f})",
                  flush=True)
            done[key] = r = train_and_score(name, seed, n, cfg, words)
            atomic.write_json(done_path, done, saved=f"the finished runs are in {done_path}; the same command continues")
            print(f"    val loss {r['val_loss']:.4f}, corpus words {r['corpus_words']}/{r['words']}, "
                  f"trained in {r['train_wall_s']:.0f} s", flush=True)
        rows.append(done[key])
    return rows


def main(argv):
    argv = [a + "=1" if a in ("--quick", "--calibrate") else a for a in argv]  # the two switches, bare
    cfg, given = cli.configure(SETTINGS, argv)
    if cfg.quick:  # tiny settings, and files of its own: never the committed calibration
        root = cfg.out_root if "out_root" in given else QUICK["out_root"]
        for key, value in {**QUICK, "calibration": os.path.join(root, "calibration.json")}.items():
            if key not in given:
                setattr(cfg, key, value)
    check_settings(cfg)
    os.chdir(REPO)  # the paths in the JSON are relative to the repository
    train_ids, val_ids, meta = splits(cfg.data_dir, cfg.dataset)
    words = corpus_words("".join(np.array(list(meta["chars"]))[train_ids]))  # the whole words of train.bin
    if cfg.calibrate or (cfg.quick and uncalibrated(read_calibration(cfg), cfg.names, cfg)):
        claim_outputs(cfg, given)
        cal = take_calibration(cfg)
        if cfg.calibrate:
            return cal
    conds, todo = plan(cfg)
    claim_outputs(cfg, given)  # (before any run: the plan is read, nothing measured yet)
    rows = run_all(todo, cfg, words)
    data = dict(what="character-level language models on the embedded corpus (docstrings of Python's standard "
                     "library) at the first screen's budget: val loss on every val token (evaluate.py) and the "
                     "share of corpus words (runs of 4+ ASCII letters that occur as whole words in train.bin) in "
                     "sample.py's three default samples (seed 1337, temperature 0.8, top_k 200, 500 characters)",
                command="python results/compare/pydocs.py" + "".join(f" {a}" for a in argv),
                settings=dict(models=cfg.names, seeds=cfg.seed_list, iters=cfg.iters, time_ref=cfg.time_ref,
                              quick=cfg.quick),
                corpus=dict(dataset=cfg.dataset, source=meta.get("source"), splits=meta["splits"]),
                counting=dict(alpha=COUNTING_ALPHA, val_loss={str(n): round(counting_loss(train_ids, val_ids, n, len(
                    meta["chars"])), 4) for n in (2, 3, 4)}),  # keys: the n of the n-gram
                model_labels={m: MODELS[m][0] for m in cfg.names}, conditions=conds, rows=rows)
    print(pydocs_tables.compare_table(data))
    if cfg.out:
        figure = cfg.out[:-len(".json")] + ".png"  # the JSON and the figure drawn from it: both or neither
        atomic.write_together({cfg.out: json.dumps(data, indent=1) + "\n", figure: figure_png(data)})
        print(f"wrote {cfg.out} and {cfg.out[:-len('.json')]}.png")
    return data


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
