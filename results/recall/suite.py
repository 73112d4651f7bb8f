"""
The in-context recall suite, reported the way the field reports it (Zoology, Arora et al.
2023): each model's learning rate is swept on multi-query associative recall (MQAR), the best
rate per model is kept, and that rate is run with more seeds; accuracy on the query tokens,
plotted against the bytes of the decoding state per layer. Two recipes: the one the earlier
search found for softmax attention, and the plain one a user starts from (train.py's GPT).

    python results/recall/suite.py --quick=True       # seconds: a smoke run into out-recall/ (the tests run it)
    python results/recall/suite.py --out_json=results/recall/results_cpu.json --figure=results/recall/recall.png   # the README's sweep
    python results/recall/suite.py --out_json=results/recall/results_cpu.json --figure=results/recall/recall.png \\
        --recipes=tuned --tasks=mqar,copy,niah             # then copy and the needle at the selected rates
    python results/recall/suite.py --models=softmax,tost --recipes=plain --learning_rates=1e-3,1e-2

The protocol, for every recipe and model (the first task of --tasks is the swept one):
  1. sweep    the swept task at every rate of --learning_rates, seed 0;
  2. select   the rate of the best validation accuracy (ties: fewer steps, then the smaller rate);
  3. seeds    the swept task at that rate with seeds 1 .. seeds - 1;
  4. tasks    every other task of --tasks at that rate, seed 0.
Every run trains from scratch: AdamW, warmup then a constant rate, a fresh batch every step
(seeded by seed and step), a validation every eval_interval steps on held-out sequences,
stopping once it reaches early_stop. Its score: accuracy on the answers of eval_examples test
sequences (per length for niah) that no run trains or selects on.

Nothing the repository ships is an output default: runs go to out-recall/ unless --out_json
and --figure name a file (the README's commands name the committed ones). Each run is added to
out_json as it ends and a rerun continues from it: a run already there is never trained again,
so an interruption costs at most the run in progress. A file of other settings (layout, tasks,
optimisation) is refused, not mixed. The tables are results/recall_tables.py's, printed at the end.
"""

import functools
import io
import json
import math
import multiprocessing
import os
import sys
import time
from collections import namedtuple

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from model import GPT, GPTConfig
from results.recall import tasks as gen
from results import recall_tables
from nanotost import atomic, cli, devices, outputs, plots, portable
from nanotost import trainkit as tk

# -----------------------------------------------------------------------------
# settings
models = "softmax,linear,tost,tost_conv,hybrid_conv"  # names in MODELS, comma separated
recipes = "tuned,plain"  # names in RECIPES, comma separated
learning_rates = "3e-4,1e-3,3e-3,1e-2"  # the sweep, comma separated
seeds = 3  # seeds of the swept task at the selected rate (0 selects, 1 .. seeds - 1 follow)
tasks = "mqar"  # names in TASKS, comma separated: the first is swept, the others run at its selected rates
# the layout every model shares
n_layer = 2
n_head = 4
n_embd = 64
# optimisation, the same for both recipes (AdamW, linear warmup, then constant or cosine to lr / 10)
lr_schedule = "constant"  # "constant" | "cosine"
beta2 = 0.999
warmup_steps = 100
grad_clip = 1.0
eval_interval = 250  # validate every this many steps (and stop once early_stop is reached)
early_stop = 0.99  # validation accuracy at which a run stops (1.01: never)
val_examples = 256  # held-out sequences of each validation (early stopping and the selection)
eval_examples = 1024  # test sequences of the final score (per length for niah)
# multi-query associative recall
mqar_pairs = 8
mqar_queries = 8
mqar_keys = 64
mqar_values = 64
mqar_batch = 64
mqar_steps = 3000  # at most (early_stop)
# copying
copy_length = 32
copy_tokens = 64
copy_batch = 64
copy_steps = 1000
# needle in a haystack: trained on all these lengths (one per batch, in turn), scored on each
niah_lengths = "32,64,128"
niah_tokens = 64
niah_batch = 64
niah_steps = 2000
# run
quick = False  # a smoke run: tiny model, few steps, short sequences, two rates (into out-recall/quick.*)
device = "cpu"
num_threads = 1  # torch CPU threads per run
workers = 1  # runs at a time, each in its own process (results do not depend on it; only the wall time)
out_json = "out-recall/results.json"  # the README's command names results/recall/results_cpu.json
figure = "out-recall/recall.png"  # "" for none
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())

# every model is the same GPT layout with these GPTConfig fields changed
MODELS = {
    "softmax": dict(attn="softmax"),
    "linear": dict(attn="linear"),
    "tost": dict(attn="tssa"),
    "tost_uniform": dict(attn="tssa", pi="uniform"),
    "tost_conv": dict(attn="tssa", short_conv=4),
    "hybrid": dict(attn="tssa", hybrid_every=2),
    "hybrid_conv": dict(attn="tssa", hybrid_every=2, short_conv=4),
}
LABELS = {"softmax": "softmax attention", "linear": "linear attention", "tost": "ToST",
          "tost_uniform": "ToST, uniform Pi", "tost_conv": "ToST + short_conv(4)",
          "hybrid": "hybrid (every 2nd block softmax)", "hybrid_conv": "hybrid + short_conv(4)"}
# what differs between the recipes: the weight decay, the readout and the embeddings' scale
RECIPES = {
    # found by the search of results/recall/README.md: softmax attention leaves the 1/K plateau early
    "tuned": dict(weight_decay=0.0, tied_head=False, embed_init=1.0),
    # train.py's GPT as it is built (the head tied to the embeddings, N(0, 0.02)) and weight
    # decay 0.1 (Zoology's, and the ToST paper's text)
    "plain": dict(weight_decay=0.1, tied_head=True, embed_init=0.02),
}
TASKS = ("mqar", "copy", "niah")
QUICK = dict(n_layer=1, n_head=2, n_embd=32, mqar_batch=16, copy_batch=16, niah_batch=16, mqar_steps=20,
             copy_steps=20, niah_steps=20, eval_interval=10, val_examples=64, eval_examples=64, warmup_steps=5,
             mqar_pairs=4, mqar_queries=4, mqar_keys=16, mqar_values=16, copy_length=8, copy_tokens=16,
             niah_lengths="16,32", niah_tokens=16, learning_rates="1e-3,1e-2", seeds=2,
             out_json="out-recall/quick.json", figure="out-recall/quick.png")
# settings that only choose which runs to do, or where and how fast: a rerun may change them
# and keep the runs it finds; any other setting changes the runs' results
RUN_ONLY = ("models", "recipes", "learning_rates", "seeds", "tasks", "num_threads", "workers", "out_json", "figure")
VAL_SEED, TEST_SEED = 10 ** 9, 2 * 10 ** 9  # held-out batches are seeded from here up, training batches below

Job = namedtuple("Job", "recipe model task lr seed")  # one training run


def names(cfg, key, known):
    """The names of setting `key`, each once and one of `known`, at least one (cli.parse_list)."""
    return cli.parse_list(key, getattr(cfg, key), allowed=known)


def rates(cfg):
    lrs = cli.parse_list("learning_rates", cfg.learning_rates, float)
    cli.require(all(0 < lr < 1 for lr in lrs),
                f"learning_rates must be one or more rates in (0, 1), got {cfg.learning_rates!r}")
    return sorted(lrs)


def check_settings(cfg):
    names(cfg, "models", MODELS)
    names(cfg, "recipes", RECIPES)
    names(cfg, "tasks", TASKS)
    rates(cfg)
    cli.check(cfg, at_least_1=("seeds", "workers", "n_layer", "n_head", "n_embd", "mqar_batch", "copy_batch",
                             "niah_batch", "mqar_steps", "copy_steps", "niah_steps", "eval_interval",
                             "val_examples", "eval_examples", "mqar_pairs", "mqar_queries", "mqar_keys",
                             "mqar_values", "copy_length", "copy_tokens", "niah_tokens"),
              non_negative=("warmup_steps", "grad_clip", "num_threads"), fraction=("beta2",),
              between={"early_stop": (0.0, 1.01)}, choices={"lr_schedule": ("constant", "cosine")})
    cli.require(cfg.seeds <= 100, f"seeds must be at most 100 (training batches are seeded per seed), got {cfg.seeds}")
    cli.require(cfg.n_embd % cfg.n_head == 0, f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    cli.require(cfg.mqar_pairs <= min(cfg.mqar_keys, cfg.mqar_values),
                f"mqar_pairs ({cfg.mqar_pairs}) must not exceed mqar_keys and mqar_values (distinct pairs)")
    lengths = cli.parse_list("niah_lengths", cfg.niah_lengths, int)
    cli.require(min(lengths) >= 4, f"niah_lengths must be at least 4 each, got {cfg.niah_lengths!r}")
    for key in ("out_json", "figure"):
        path = getattr(cfg, key)
        cli.require(not path or not os.path.isdir(path), f"{key} is a folder ({path}); give a file name")
    cli.require(cfg.out_json, "out_json must name a file: every run is written there as it ends")


# -----------------------------------------------------------------------------
# the tasks and the models


class Task:
    """One task at the suite's setting: batches (x, y) by seed, and its vocabulary, block size
    and chance level. niah has several lengths: batch(seed, length)."""

    def __init__(self, name, cfg):
        self.name = name
        if name == "mqar":
            kw = dict(n_pairs=cfg.mqar_pairs, n_queries=cfg.mqar_queries, n_keys=cfg.mqar_keys,
                      n_values=cfg.mqar_values)
            self.vocab_size = gen.mqar_layout(kw["n_keys"], kw["n_values"]).vocab_size
            self.lengths = [2 * (kw["n_pairs"] + kw["n_queries"])]
            self.make = lambda B, seed, T: gen.mqar(B, seed=seed, **kw)
            self.chance = gen.chance("mqar", **kw)
            self.setting = kw
        elif name == "copy":
            kw = dict(length=cfg.copy_length, n_tokens=cfg.copy_tokens)
            self.vocab_size = gen.copy_layout(kw["n_tokens"]).vocab_size
            self.lengths = [2 * kw["length"] + 1]
            self.make = lambda B, seed, T: gen.copy(B, seed=seed, **kw)
            self.chance = gen.chance("copy", **kw)
            self.setting = kw
        else:
            n_tokens = cfg.niah_tokens
            self.vocab_size = gen.niah_layout(n_tokens).vocab_size
            self.lengths = sorted(cli.parse_list("niah_lengths", cfg.niah_lengths, int))
            self.make = lambda B, seed, T: gen.niah(B, T, n_tokens, seed=seed)
            self.chance = gen.chance("niah", n_tokens=n_tokens)
            self.setting = dict(lengths=self.lengths, n_tokens=n_tokens)
        self.block_size = max(self.lengths)
        self.batch, self.steps = getattr(cfg, f"{name}_batch"), getattr(cfg, f"{name}_steps")

    def train_batch(self, B, step, seed):
        T = self.lengths[step % len(self.lengths)]  # niah: the lengths in turn
        return self.make(B, seed * 1_000_003 + step, T)

    def held_out(self, n, T, first_seed, B=256):
        """n held-out sequences of length T in batches of at most B, the same for every run
        (seeded from first_seed up: VAL_SEED for validation, TEST_SEED for the score)."""
        for k in range(math.ceil(n / B)):
            yield self.make(min(B, n - k * B), first_seed + k, T)


def build_model(name, recipe, task, cfg):
    """The repository's GPT with the model's settings, and the recipe's readout and embeddings:
    tied_head keeps GPT's head tied to the token embedding; otherwise the output layer is a
    separate matrix (init N(0, 0.02)). The token and position embeddings start at std
    embed_init (GPT's own: 0.02). No layer scale (layer_scale_init None), as GPT-2."""
    c = GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
                  n_embd=cfg.n_embd, bias=False, dropout=0.0, layer_scale_init=None, **MODELS[name])
    model = GPT(c)
    r = RECIPES[recipe]
    if not r["tied_head"]:
        model.lm_head = torch.nn.Linear(c.n_embd, c.vocab_size, bias=False)
        torch.nn.init.normal_(model.lm_head.weight, mean=0.0, std=0.02)
    with torch.no_grad():
        model.wte.weight.normal_(0.0, r["embed_init"])  # (tied: the head too)
        model.wpe.weight.normal_(0.0, r["embed_init"])
    return model


@torch.no_grad()
def state_bytes_per_layer(model, task):
    """Bytes of the decoding state after one sequence of the task's (longest) length, per
    layer: what a model carries from token to token (fp32). ToST 2C + H floats (+ (k - 1) C
    with the short convolution), linear attention H p^2 + H p, a KV cache 2 T C."""
    x, _ = task.make(1, 0, task.block_size)  # (1, T)
    state = model.init_state(1)
    model.prefill(x.to(model.wte.weight.device), state)
    return sum(layer.nbytes() for layer in state.layers) / len(state.layers)


@torch.no_grad()
def accuracy(model, task, n, T, first_seed, device):
    """Fraction of the scored positions (y != -1) whose argmax prediction is the answer."""
    model.eval()
    right = total = 0
    for x, y in task.held_out(n, T, first_seed):
        logits, _ = model(x.to(device))  # (B, T, V)
        y = y.to(device)
        scored = y != -1
        right += (logits.argmax(-1)[scored] == y[scored]).sum().item()
        total += scored.sum().item()
    model.train()
    return right / total


def lr_at(step, lr, cfg, max_steps):
    """Linear warmup over warmup_steps, then constant, or cosine decay to lr / 10 at the last step."""
    if step < cfg.warmup_steps:
        return lr * (step + 1) / (cfg.warmup_steps + 1)
    if cfg.lr_schedule == "constant":
        return lr
    ratio = (step - cfg.warmup_steps) / max(max_steps - cfg.warmup_steps, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(ratio, 1.0))))


# -----------------------------------------------------------------------------
# one run


def train_one(job, cfg, say=None):
    """Train job.model under job.recipe on job.task at job.lr from seed job.seed; its record."""
    say = say or functools.partial(print, flush=True)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    task = Task(job.task, cfg)
    torch.manual_seed(job.seed)
    model = build_model(job.model, job.recipe, task, cfg).to(cfg.device)
    opt = tk.configure_adamw(model, RECIPES[job.recipe]["weight_decay"], job.lr, (0.9, cfg.beta2))
    # the hardest length decides the validation (niah: the longest)
    validate = lambda: min(accuracy(model, task, cfg.val_examples, T, VAL_SEED, cfg.device) for T in task.lengths)
    t0, step, curve, val = time.time(), 0, [], 0.0
    while step < task.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, job.lr, cfg, task.steps)
        x, y = task.train_batch(task.batch, step, job.seed)  # (B, T) each
        _, loss = model(x.to(cfg.device), y.to(cfg.device))
        if not math.isfinite(loss.item()):
            say(f"    non-finite loss at step {step}: this run stops here")
            break
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % cfg.eval_interval == 0 or step == task.steps:
            val = validate()
            curve.append([step, round(time.time() - t0, 1), round(val, 4)])  # lists: as JSON reads back
            say(f"    step {step:>5}  loss {loss.item():.4f}  val acc {val:.3f}  {time.time() - t0:.0f}s")
            if val >= cfg.early_stop:
                break
    train_s = time.time() - t0
    acc = {str(T): accuracy(model, task, cfg.eval_examples, T, TEST_SEED, cfg.device) for T in task.lengths}
    return dict(job._asdict(), acc=acc, val_acc=round(val, 4), steps=step, train_s=round(train_s, 1),
                load=round(portable.load_average()[0], 2), curve=curve, params=model.get_num_params(),
                state_bytes_per_layer=state_bytes_per_layer(model, task))


def run_job(job, cfg):
    """One run in a worker process (or inline): its Job and its record."""
    return job, train_one(job, cfg, say=lambda text: print(f"  [{job.recipe} {job.model} {job.task} lr {job.lr:g} "
                                                         f"seed {job.seed}] {text.strip()}", flush=True))


# -----------------------------------------------------------------------------
# the results file: read, continued, written after every run


def identity(cfg):
    """The settings that decide the runs' results (RUN_ONLY aside)."""
    return {k: v for k, v in vars(cfg).items() if k not in RUN_ONLY}


def load_results(cfg):
    """The runs already in out_json (none if it does not exist); refused if it holds runs of
    other settings, so that a table never mixes two setups."""
    if not os.path.exists(cfg.out_json):
        return dict(runs=[])
    fix = "restore it (git checkout, for a committed one), or name another --out_json, or move it away"
    data = atomic.read_json(cfg.out_json, fix)
    with atomic.reading(cfg.out_json, fix):  # what a continued suite reads of it, each of its type
        old = dict(data["identity"])
        for r in list(data["runs"]):  # a run's key, and what the selection and the tables read
            for field in ("lr", "seed", "val_acc", "steps"):
                atomic.json_number(r[field], field)
            _ = r["recipe"], r["model"], r["task"], dict(r["acc"])
    new = identity(cfg)
    differ = [f"{k}: {old.get(k)!r} there, {new[k]!r} here" for k in new if old.get(k) != new[k]]
    cli.require(not differ, f"{cfg.out_json} holds runs of other settings ({'; '.join(differ)}); name another "
                            "--out_json, or move it away to start over")
    return data


def selected_rates(data, task):
    """{recipe: {model: lr}} of `task`'s sweep: the best validation accuracy on seed 0 over the
    rates (ties: fewer steps, then the smaller rate)."""
    best = {}
    for r in data["runs"]:
        if r["task"] == task and r["seed"] == 0:  # the sweep (other seeds run only at the selected rate)
            key = (-r["val_acc"], r["steps"], r["lr"])
            current = best.get((r["recipe"], r["model"]))
            if current is None or key < current[0]:
                best[(r["recipe"], r["model"])] = (key, r["lr"])
    out = {}
    for (recipe, model), (_, lr) in sorted(best.items()):
        out.setdefault(recipe, {})[model] = lr
    return out


def save_results(cfg, data, swept, figure=""):
    """Write out_json (atomically) with what the tables need beside the runs; with `figure` (a
    PNG path), the figure drawn from it too, the two as one unit (atomic.write_together)."""
    data["identity"] = identity(cfg)
    data["settings"] = vars(cfg)
    data["swept"] = swept
    data["selected"] = selected_rates(data, swept)
    data["chance"] = {name: Task(name, cfg).chance for name in TASKS}
    data["lengths"] = {name: Task(name, cfg).lengths for name in TASKS}
    data["labels"], data["recipes"] = LABELS, RECIPES
    data["torch"] = torch.__version__
    files = {cfg.out_json: json.dumps(data, indent=1) + "\n"} | ({figure: figure_png(data)} if figure else {})
    atomic.write_together(files)
    cli.on_interrupt(f"the runs that ended are in {cfg.out_json}: the same command continues from them")


def run_all(jobs, cfg, data, swept, phase):
    """Run the jobs not in data yet (`workers` at a time), adding each record as it ends."""
    done = {Job(*(r[k] for k in Job._fields)) for r in data["runs"]}
    todo = [j for j in jobs if j not in done]
    print(f"{phase}: {len(jobs) - len(todo)} of {len(jobs)} runs already in {cfg.out_json}, {len(todo)} to run",
          flush=True)
    if not todo:
        return
    t0 = time.time()
    if cfg.workers > 1:  # one process per run (spawned: no forked thread pools)
        pool = multiprocessing.get_context("spawn").Pool(cfg.workers)
        results = pool.imap_unordered(functools.partial(run_job, cfg=cfg), todo)
    else:
        pool, results = None, (run_job(job, cfg) for job in todo)
    try:
        for k, (job, record) in enumerate(results, 1):
            data["runs"].append(record)
            save_results(cfg, data, swept)
            chance = Task(job.task, cfg).chance
            print(f"{phase} {k}/{len(todo)}: {job.recipe} {job.model} {job.task} lr {job.lr:g} seed {job.seed}: "
                  f"test acc {min(record['acc'].values()):.3f} (chance {chance:.3f}), {record['steps']} steps, "
                  f"{record['train_s']:.0f}s; {time.time() - t0:.0f}s in this phase", flush=True)
    finally:
        if pool is not None:
            pool.terminate()


def figure_png(data):
    """Accuracy of the swept task against the decoding-state bytes per layer (Zoology's
    recall-memory plot): one point per model and recipe at its selected rate, the seeds' mean,
    their range as the error bar; filled circles the tuned recipe, open squares the plain one."""
    import matplotlib.ticker

    plt = plots.pyplot()
    from matplotlib.lines import Line2D

    swept, rows = data["swept"], recall_tables.best_rows(data, data["swept"])
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    colors = dict(zip(MODELS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    markers = {"tuned": "o", "plain": "s"}
    for row in rows:
        accs, color = row["accs"], colors[row["model"]]
        mean = sum(accs) / len(accs)
        ax.errorbar(row["state_bytes"], mean, yerr=[[mean - min(accs)], [max(accs) - mean]], linestyle="none",
                    marker=markers[row["recipe"]], markersize=7, color=color, capsize=3,
                    markerfacecolor=color if row["recipe"] == "tuned" else "white")
    ax.axhline(data["chance"][swept], color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda b, _: f"{b:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, 1.03)
    ax.set_xlabel("decoding state per layer (bytes, fp32, one sequence)")
    ax.set_ylabel("accuracy on the query tokens")
    n_seeds = max((len(row["accs"]) for row in rows), default=0)
    ax.set_title(f"{swept.upper()}: the best rate per model, mean and range of "
                 f"{recall_tables.plural(n_seeds, 'seed')}", fontsize=10)
    # the legend in two parts: the models by colour, the recipes by marker
    models = list(dict.fromkeys(row["model"] for row in rows))
    handles = [Line2D([], [], color=colors[m], marker="o", linestyle="none", label=LABELS[m]) for m in models]
    handles += [Line2D([], [], color="black", marker=markers[r], markerfacecolor="black" if r == "tuned" else "white",
                       linestyle="none", label=f"{r} recipe") for r in RECIPES if any(row["recipe"] == r for row in rows)]
    handles.append(Line2D([], [], color="grey", linestyle="--", label="chance"))
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    plt.close(fig)
    return buf.getvalue()


def main(argv):
    cfg, given = cli.configure(SETTINGS, argv)
    if cfg.quick:
        for key, value in QUICK.items():
            if key not in given:  # explicit settings win
                setattr(cfg, key, value)
    check_settings(cfg)
    cfg.device, _ = devices.choose_device_dtype(cfg.device, "float32")
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    model_list, recipe_list = names(cfg, "models", MODELS), names(cfg, "recipes", RECIPES)
    task_list = names(cfg, "tasks", TASKS)
    swept, lrs = task_list[0], rates(cfg)
    for path, key in ((cfg.out_json, "--out_json"), (cfg.figure, "--figure")):  # one writer each, before any run
        if path:
            outputs.claim_output(path, f"{key}=<another file>")
    data = load_results(cfg)
    if data["runs"]:  # (said once a run has ended: save_results says it then)
        cli.on_interrupt(f"the runs that ended are in {cfg.out_json}: the same command continues from them")
    cli.require(data.get("swept", swept) == swept,
                f"{cfg.out_json} holds a sweep of {data.get('swept')}: --tasks must start with it")
    t0, load0 = time.time(), portable.load_average()
    print(f"{cfg.device}, {cfg.workers} process(es) of {cfg.num_threads} thread(s); load average {load0[0]:.2f}",
          flush=True)
    for recipe in recipe_list:  # one recipe after the other: an interrupted suite has whole recipes first
        # 1. the sweep: every rate on seed 0
        run_all([Job(recipe, m, swept, lr, 0) for m in model_list for lr in lrs], cfg, data, swept, f"{recipe} sweep")
        # 2. more seeds at each selected rate, and the other tasks at it
        chosen = selected_rates(data, swept)[recipe]
        more = [Job(recipe, m, swept, chosen[m], s) for m in model_list for s in range(1, cfg.seeds)]
        more += [Job(recipe, m, t, chosen[m], 0) for t in task_list[1:] for m in model_list]
        run_all(more, cfg, data, swept, f"{recipe} at the selected rates")
    save_results(cfg, data, swept, cfg.figure)  # the figure drawn from the JSON beside it: both or neither
    for name in recall_tables.SUITE_TABLES:
        print(f"\n{name}:\n{recall_tables.TABLES[name][1](data)}")
    load1 = portable.load_average()
    print(f"\n{time.time() - t0:.0f}s; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end; "
          f"runs in {cfg.out_json}")
    if cfg.figure:
        print(f"figure: {cfg.figure}")
    return data


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
