"""
Character-level language modelling with every variant under the same wall-time budget: runs
train.py on the embedded corpus (config/pydocs_char_tost.py or _softmax.py plus the variant's
settings) for --budget seconds each, `parallel` runs at a time on one thread each, then
prints the validation loss table and writes JSON.

    python prepare_char.py && python recall/pydocs_variants.py                  # 240 s each, 2 at a time
    python recall/pydocs_variants.py --budget=60 --variants=tost,tost_conv --out=/tmp/p.json

Every run: `python train.py <config> --max_time=<budget> --max_iters=100000 --eval_interval=100000
--eval_iters=50 --num_threads=1 --out_dir=<out_root>/<variant>` and the variant's settings, so
the only evaluation is the one at the end (50 batches of val). Runs write their own out_dir
(a scratch run refuses an existing checkpoint: remove <out_root> to run again).
"""

import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cli

# -----------------------------------------------------------------------------
variants = "tost,softmax,linear,tost_uniform,tost_conv,hybrid"
budget = 240.0  # seconds of training per run
parallel = 2  # runs at a time (one thread each)
out_root = "out-variants"
out = "results/pydocs_variants_cpu.json"
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = {  # variant -> config file and extra settings (5 softmax/linear layers = 6 TSSA layers in parameters)
    "tost": ("config/pydocs_char_tost.py", []),
    "softmax": ("config/pydocs_char_softmax.py", []),
    "linear": ("config/pydocs_char_softmax.py", ["--attn=linear"]),
    "tost_uniform": ("config/pydocs_char_tost.py", ["--pi=uniform"]),
    "tost_conv": ("config/pydocs_char_tost.py", ["--short_conv=4"]),
    "hybrid": ("config/pydocs_char_tost.py", ["--hybrid_every=2"]),
}


def command(name, C):
    config, extra = RUNS[name]
    return [sys.executable, os.path.join(REPO, "train.py"), os.path.join(REPO, config), *extra,
            f"--out_dir={os.path.join(C.out_root, name)}", f"--max_time={C.budget}", "--max_iters=100000",
            "--eval_interval=100000", "--eval_iters=50", "--log_interval=100", "--num_threads=1"]


def summary(name, C):
    """The run's final evaluation and its training speed, from its log.jsonl."""
    with open(os.path.join(C.out_root, name, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    final = [r for r in records if "val_loss" in r][-1]
    speeds = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    import torch  # (only here: the runs themselves are subprocesses)

    ckpt = torch.load(os.path.join(C.out_root, name, "ckpt.pt"), map_location="cpu", weights_only=False)
    params = sum(v.numel() for k, v in ckpt["model"].items() if k != "lm_head.weight")  # tied head once
    return dict(variant=name, val_loss=round(final["val_loss"], 4), train_loss=round(final["train_loss"], 4),
                steps=final["iter"], train_tokens_per_s=round(sorted(speeds)[len(speeds) // 2]) if speeds else None,
                params=params, settings=RUNS[name][1])


def main(argv):
    C, _ = cli.configure(SETTINGS, argv)
    names = [v.strip() for v in C.variants.split(",") if v.strip()]
    for name in names:
        cli.require(name in RUNS, f"unknown variant {name!r}; choose from {', '.join(RUNS)}")
    cli.check(C, at_least_1=("parallel",), positive=("budget",))
    os.makedirs(C.out_root, exist_ok=True)
    pending, running, t0 = list(names), [], time.time()
    while pending or running:
        while pending and len(running) < C.parallel:
            name = pending.pop(0)
            log = open(os.path.join(C.out_root, f"{name}.out"), "w")  # the run's output
            running.append((name, subprocess.Popen(command(name, C), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)))
            print(f"started {name}", flush=True)
        time.sleep(2)
        for name, proc in list(running):
            if proc.poll() is not None:
                running.remove((name, proc))
                cli.require(proc.returncode == 0, f"the {name} run failed: see {C.out_root}/{name}.out")
                print(f"finished {name} ({time.time() - t0:.0f}s)", flush=True)
    rows = [summary(name, C) for name in names]
    print(f"| variant | params | steps in {C.budget:.0f} s | val loss | train tok/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['params']:,} | {r['steps']} | {r['val_loss']:.3f} | {r['train_tokens_per_s']:,} |")
    if C.out:
        os.makedirs(os.path.dirname(C.out) or ".", exist_ok=True)
        with open(C.out, "w") as f:
            json.dump(dict(settings=vars(C), rows=rows, loadavg=os.getloadavg()), f, indent=1)
    return rows


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
