"""
The in-context recall suite: trains every model variant on every task from scratch, then
prints one table (accuracy on the answers only, chance beside every number), writes the
results as JSON and draws a matplotlib figure.

    python recall/suite.py                          # the default setting: CPU, 2 processes of 1 thread
    python recall/suite.py --quick=True             # seconds: a smoke run (the tests use it)
    python recall/suite.py --models=softmax,tost --tasks=mqar --learning_rate=3e-4
    python recall/suite.py --niah_lengths=256,512,1024,2048 --device=cuda --out_json=recall/results_gpu.json

Tasks (recall/tasks.py): multi-query associative recall (mqar), copying a segment (copy),
needle in a haystack at several lengths (niah). Models (MODELS below): one GPT layout
(n_layer, n_head, n_embd) with softmax attention, causal linear attention, ToST (TSSA), ToST
with uniform Pi, ToST with a short causal convolution before TSSA, the hybrid (every second
block softmax attention), and the hybrid with the convolution. Every model gets the same
embedding and readout (build_model says which and why). Each (model, task) run: AdamW,
warmup then a constant learning rate, a fresh batch every step (seeded by the step), an
evaluation on held-out batches every eval_interval steps, stopping early once the hardest
length reaches early_stop. The final numbers are on eval_examples fresh sequences (per length
for niah). Settings are the globals below, overridden by --key=value (as in train.py);
recall/README.md lists the settings searched until softmax attention solved MQAR.
"""

import functools
import json
import math
import multiprocessing
import os
import sys
import time

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli
import trainkit as tk
from model import GPT, GPTConfig
from recall import tasks as gen

# -----------------------------------------------------------------------------
# settings
models = "softmax,linear,tost,tost_uniform,tost_conv,hybrid,hybrid_conv"  # names in MODELS, comma separated
tasks = "mqar,copy,niah"  # names in TASKS, comma separated
# the layout every variant shares
n_layer = 2
n_head = 4
n_embd = 64
layer_scale_init = 0.0  # 0: no layer scale
tied_head = False  # False: an untied output layer for every model (see build_model); True: GPT's tied head
embed_init = 1.0  # std of the token and position embeddings at initialisation (GPT's own: 0.02)
# optimisation (AdamW, linear warmup, then constant or cosine decay to learning_rate / 10)
learning_rate = 1e-3
lr_schedule = "constant"  # "constant" | "cosine"
beta2 = 0.999
warmup_steps = 100
weight_decay = 0.0
grad_clip = 1.0
eval_interval = 250  # evaluate every this many steps (and stop once early_stop is reached)
early_stop = 0.99  # accuracy at which training stops (1.01: never)
eval_examples = 1024  # held-out sequences of the final score (per length for niah)
# multi-query associative recall
mqar_pairs = 8
mqar_queries = 8
mqar_keys = 64
mqar_values = 64
mqar_batch = 128
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
quick = False  # a smoke run: tiny model, few steps, short sequences
seed = 1337
device = "cpu"
num_threads = 1  # torch CPU threads per run
workers = 2  # runs at a time, each in its own process
out_json = "recall/results_cpu.json"
figure = "recall/recall.png"  # "" for none
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())

# every variant is the same GPT layout with these GPTConfig fields changed
MODELS = {
    "softmax": dict(attn="softmax"),
    "linear": dict(attn="linear"),
    "tost": dict(attn="tssa"),
    "tost_uniform": dict(attn="tssa", pi="uniform"),
    "tost_conv": dict(attn="tssa", short_conv=4),
    "hybrid": dict(attn="tssa", hybrid_every=2),
    "hybrid_conv": dict(attn="tssa", hybrid_every=2, short_conv=4),
}
TASKS = ("mqar", "copy", "niah")
QUICK = dict(n_layer=1, n_head=2, n_embd=32, mqar_batch=16, copy_batch=16, niah_batch=16, mqar_steps=20,
             copy_steps=20, niah_steps=20, eval_interval=10, eval_examples=64, warmup_steps=5, mqar_pairs=4, mqar_queries=4, mqar_keys=16, mqar_values=16, copy_length=8,
             copy_tokens=16, niah_lengths="16,32", niah_tokens=16)
EVAL_SEED = 10 ** 9  # evaluation batches are seeded from here up, training batches below


def parse_list(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def check_settings(C):
    for name in parse_list(C.models):
        cli.require(name in MODELS, f"unknown model {name!r} in --models; choose from {', '.join(MODELS)}")
    for name in parse_list(C.tasks):
        cli.require(name in TASKS, f"unknown task {name!r} in --tasks; choose from {', '.join(TASKS)}")
    cli.check(C, at_least_1=("workers", "n_layer", "n_head", "n_embd", "mqar_batch", "copy_batch", "niah_batch",
                             "eval_interval", "eval_examples",
                             "mqar_pairs", "mqar_queries", "mqar_keys", "mqar_values", "copy_length", "copy_tokens",
                             "niah_tokens"),
              non_negative=("mqar_steps", "copy_steps", "niah_steps", "warmup_steps", "weight_decay", "grad_clip", "layer_scale_init"),
              positive=("learning_rate", "embed_init"))
    cli.check(C, fraction=("beta2",), choices={"lr_schedule": ("constant", "cosine")})
    cli.require(C.n_embd % C.n_head == 0, f"n_embd ({C.n_embd}) must be divisible by n_head ({C.n_head})")
    cli.require(C.mqar_pairs <= min(C.mqar_keys, C.mqar_values),
                f"mqar_pairs ({C.mqar_pairs}) must not exceed mqar_keys and mqar_values (distinct pairs)")
    try:
        lengths = [int(n) for n in parse_list(C.niah_lengths)]
    except ValueError:
        raise cli.ConfigError(f"niah_lengths must be integers separated by commas, got {C.niah_lengths!r}") from None
    cli.require(lengths and min(lengths) >= 4, f"niah_lengths must be at least 4 each, got {C.niah_lengths!r}")


class Task:
    """One task at the suite's setting: batches (x, y) by seed, and its vocabulary, block size
    and chance level. niah has several lengths: batch(seed, length)."""

    def __init__(self, name, C):
        self.name = name
        if name == "mqar":
            kw = dict(n_pairs=C.mqar_pairs, n_queries=C.mqar_queries, n_keys=C.mqar_keys,
                      n_values=C.mqar_values)
            self.vocab_size = gen.mqar_layout(kw["n_keys"], kw["n_values"]).vocab_size
            self.lengths = [2 * (kw["n_pairs"] + kw["n_queries"])]
            self.make = lambda B, seed, T: gen.mqar(B, seed=seed, **kw)
            self.chance = gen.chance("mqar", **kw)
            self.setting = kw
        elif name == "copy":
            kw = dict(length=C.copy_length, n_tokens=C.copy_tokens)
            self.vocab_size = gen.copy_layout(kw["n_tokens"]).vocab_size
            self.lengths = [2 * kw["length"] + 1]
            self.make = lambda B, seed, T: gen.copy(B, seed=seed, **kw)
            self.chance = gen.chance("copy", **kw)
            self.setting = kw
        else:
            n_tokens = C.niah_tokens
            self.vocab_size = gen.niah_layout(n_tokens).vocab_size
            self.lengths = sorted(int(n) for n in parse_list(C.niah_lengths))
            self.make = lambda B, seed, T: gen.niah(B, T, n_tokens, seed=seed)
            self.chance = gen.chance("niah", n_tokens=n_tokens)
            self.setting = dict(lengths=self.lengths, n_tokens=n_tokens)
        self.block_size = max(self.lengths)

    def train_batch(self, B, step, seed):
        T = self.lengths[step % len(self.lengths)]  # niah: the lengths in turn
        return self.make(B, seed * 1_000_003 + step, T)

    def eval_batches(self, n, B, T, seed):
        """Held-out batches of length T (seeds no training batch uses), n sequences in all."""
        for k in range(math.ceil(n / B)):
            x, y = self.make(min(B, n - k * B), EVAL_SEED + seed * 1009 + k, T)
            yield x, y


def build_model(name, task, C):
    """The repository's GPT with the variant's settings, and the same embedding and readout
    for every variant: unless tied_head, the output layer is a separate matrix (init N(0, 0.02));
    the token and position embeddings start at std embed_init. With GPT's own choices (tied
    head, embeddings at 0.02) the softmax baseline sat at the 1/K plateau for over 500k
    training sequences at K = 4 pairs, far beyond a CPU run; with these it leaves it after
    about 50k (recall/README.md lists every setting searched). The sequence mixers are what
    the suite compares, not the readout."""
    c = GPTConfig(vocab_size=task.vocab_size, block_size=task.block_size, n_layer=C.n_layer, n_head=C.n_head,
                  n_embd=C.n_embd, bias=False, dropout=0.0, layer_scale_init=C.layer_scale_init or None,
                  **MODELS[name])
    model = GPT(c)
    if not C.tied_head:
        model.lm_head = torch.nn.Linear(c.n_embd, c.vocab_size, bias=False)
        torch.nn.init.normal_(model.lm_head.weight, mean=0.0, std=0.02)
    with torch.no_grad():
        model.wte.weight.normal_(0.0, C.embed_init)  # (tied: the head too)
        model.wpe.weight.normal_(0.0, C.embed_init)
    return model


@torch.no_grad()
def accuracy(model, task, C, T, n=None):
    """Fraction of the scored positions (y != -1) whose argmax prediction is the answer."""
    model.eval()
    right = total = 0
    for x, y in task.eval_batches(n or C.eval_examples, 256, T, C.seed):
        x, y = x.to(C.device), y.to(C.device)
        logits, _ = model(x)
        scored = y != -1
        right += (logits.argmax(-1)[scored] == y[scored]).sum().item()
        total += scored.sum().item()
    model.train()
    return right / total


def lr_at(step, C, max_steps):
    """Linear warmup over warmup_steps, then constant, or cosine decay to learning_rate / 10
    at the task's last step."""
    if step < C.warmup_steps:
        return C.learning_rate * (step + 1) / (C.warmup_steps + 1)
    if C.lr_schedule == "constant":
        return C.learning_rate
    ratio = (step - C.warmup_steps) / max(max_steps - C.warmup_steps, 1)
    return C.learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(ratio, 1.0))))


def train_one(name, task, C, say=None):
    """Train model `name` on `task`; returns its record (accuracy per length, steps, time)."""
    say = say or functools.partial(print, flush=True)
    torch.manual_seed(C.seed)
    model = build_model(name, task, C).to(C.device)
    opt = model.configure_optimizers(C.weight_decay, C.learning_rate, (0.9, C.beta2))
    t0, step, curve = time.time(), 0, []
    evaluate = lambda n: min(accuracy(model, task, C, T, n) for T in task.lengths)  # the hardest length
    max_steps, batch = getattr(C, f"{task.name}_steps"), getattr(C, f"{task.name}_batch")
    while step < max_steps:
        lr = lr_at(step, C, max_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = task.train_batch(batch, step, C.seed)
        _, loss = model(x.to(C.device), y.to(C.device))
        if not math.isfinite(loss.item()):
            say(f"  {name} {task.name}: non-finite loss at step {step}; stopping this run")
            break
        loss.backward()
        if C.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), C.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % C.eval_interval == 0 or step == max_steps:
            acc = evaluate(256)
            curve.append((step, round(time.time() - t0, 1), acc))
            say(f"  {name:<13}{task.name:<6}step {step:>5}  loss {loss.item():.4f}  acc {acc:.3f}  "
                f"{time.time() - t0:.0f}s")
            if acc >= C.early_stop:
                break
    train_s = time.time() - t0
    acc = {T: accuracy(model, task, C, T) for T in task.lengths}
    return dict(model=name, task=task.name, acc={str(T): a for T, a in acc.items()}, chance=task.chance,
                steps=step, train_s=round(train_s, 1), params=model.get_num_params(), curve=curve,
                setting=task.setting, config={k: v for k, v in MODELS[name].items()})


def run_job(name, task_name, C):
    """One (model, task) run; in a worker process when workers > 1."""
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    return train_one(name, Task(task_name, C), C)


def table(results, task_list, model_list):
    """Markdown table: one row per model, one column per task (and niah length), chance beside."""
    cols = []
    for t in task_list:
        rec = next(r for r in results if r["task"] == t.name)
        cols += [(t.name, T) for T in rec["acc"]] if t.name == "niah" else [(t.name, next(iter(rec["acc"])))]
    head = ["model", "params"] + [f"{n} (T={T})" if n == "niah" else n for n, T in cols] + ["train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    chance = {t.name: t.chance for t in task_list}
    for m in model_list:
        recs = {r["task"]: r for r in results if r["model"] == m}
        cells = [m, f"{next(iter(recs.values()))['params']:,}"]
        cells += [f"{recs[n]['acc'][T]:.3f} (chance {chance[n]:.3f})" for n, T in cols]
        cells.append(f"{sum(r['train_s'] for r in recs.values()):.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(results, task_list, model_list, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, T) for t in task_list for T in (t.lengths if t.name == "niah" else t.lengths[:1])]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 3.2), sharey=True, squeeze=False)
    for ax, (t, T) in zip(axes[0], panels):
        accs = [next(r for r in results if r["model"] == m and r["task"] == t.name)["acc"][str(T)] for m in model_list]
        ax.bar(range(len(model_list)), accs, color="tab:blue")
        ax.axhline(t.chance, color="tab:red", linestyle="--", linewidth=1, label="chance")
        ax.set_xticks(range(len(model_list)), model_list, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"{t.name} (T={T})", fontsize=9)
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("accuracy on the answers")
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    C, given = cli.configure(SETTINGS, argv)
    if C.quick:
        for key, value in QUICK.items():
            if key not in given:  # explicit settings win
                setattr(C, key, value)
    check_settings(C)
    C.device, _ = tk.choose_device_dtype(C.device, "float32")
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    model_list, task_list = parse_list(C.models), [Task(n, C) for n in parse_list(C.tasks)]
    jobs = [(name, task.name, C) for task in task_list for name in model_list]
    t0 = time.time()
    if C.workers > 1:  # one process per run, `workers` at a time (spawned: no forked thread pools)
        with multiprocessing.get_context("spawn").Pool(C.workers) as pool:
            results = pool.starmap(run_job, jobs, chunksize=1)
    else:
        results = [run_job(*job) for job in jobs]
    print(table(results, task_list, model_list))
    print(f"{time.time() - t0:.0f}s in all on {C.device} ({C.workers} process(es) of {C.num_threads} thread(s))")
    if C.out_json:
        os.makedirs(os.path.dirname(C.out_json) or ".", exist_ok=True)
        with open(C.out_json, "w") as f:
            json.dump(dict(settings=vars(C), results=results, torch=torch.__version__), f, indent=1)
    if C.figure:
        draw(results, task_list, model_list, C.figure)
    return results


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
