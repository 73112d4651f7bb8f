"""
The runs behind lra/README.md's results tables: one command that writes one JSON
(lra/results_listops.json when --out names it; a run told nothing writes out-lra/listops.json,
so a trial never overwrites the committed results), from which `python results/render.py` writes the tables.

    python lra/listops_runs.py --out=lra/results_listops.json               # both grids, one thread: 12 + 98 min here
    python lra/listops_runs.py --out=lra/results_listops.json --grids=tiny  # one grid again (the other kept)
    python lra/listops_runs.py --grids=tiny --runs=shared_tssa --seeds=1 --vector_paths=native --out=/tmp/l.json

For each grid it generates the data when absent (lra/generate.py with fixed settings and seed:
the same files on every machine; their sha256 go into the JSON), then runs `python lra/train.py
CONFIG --seed=S` once per run, seed and vector path, one process of one thread at a time, each
into a fresh temporary out_dir, and reads the result from that run's log.jsonl and checkpoint.

Why vector paths. A run is bit-for-bit repeatable on one machine (one thread, fixed seed), but
these tiny models are chaotic in the rounding: the same seed on a CPU whose PyTorch takes
another vector path (AVX-512, AVX2, or none) ends several points of accuracy apart, which is
why figures copied from other machines did not reproduce. PyTorch's ATEN_CPU_CAPABILITY picks
the path (one the CPU has, or lower), so one machine can measure that spread: "native" leaves
it unset, "avx2" and "default" (no vector instructions) set it. A path that turns out to be the
same as an earlier one on this CPU is run once.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lra.encoder  # noqa: F401 (the lra kind of checkpoint: its model)
from lra.data import load_split
from nanotost import atomic, checkpoints, cli, outputs, portable

# -----------------------------------------------------------------------------
# settings
grids = "tiny,mini"  # which grids to run (GRIDS below)
runs = "all"  # "all", or some run names of the chosen grids (e.g. shared_tssa,pertask_softmax)
seeds = "1,2,3"
vector_paths = "grid"  # "grid": each grid's own (VECTOR_PATHS); or e.g. "native" or "native,avx2,default"
max_iters = 0  # 0: each config's; n: a shorter smoke run (the JSON says so)
data_root = "data"  # the grids' data are generated under it when absent
out = "out-lra/listops.json"  # the README's command names the committed lra/results_listops.json
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VECTOR_PATHS = ("native", "avx2", "default")
SCHEMA = "nanotost-lra-listops/1"

# A grid: its data (a folder under data_root and lra/generate.py's settings) and its runs
# (name -> config file, extra settings). The tiny grid is the reviewers' question: one shared
# configuration for every attention (lra/configs/listops_tiny_shared.py, which is
# listops_tiny_tost.py with the attention left open), and the per-task softmax partner sized to
# ToST's parameter count. The mini grid: longer, deeper trees, ToST at two learning rates.
GRIDS = {
    "tiny": dict(
        folder="listops_tiny",
        generate=["--n_train=2000", "--n_val=400", "--n_test=400", "--min_len=10", "--max_len=60",
                  "--max_depth=3", "--max_args=5"],
        vector_paths=VECTOR_PATHS,
        runs={"shared_tssa": ("lra/configs/listops_tiny_shared.py", ["--attn=tssa"]),
              "shared_softmax": ("lra/configs/listops_tiny_shared.py", ["--attn=softmax"]),
              "shared_linear": ("lra/configs/listops_tiny_shared.py", ["--attn=linear"]),
              "pertask_softmax": ("lra/configs/listops_tiny_softmax.py", [])}),
    "mini": dict(
        folder="listops_mini",
        generate=["--n_train=20000", "--n_val=1000", "--n_test=1000", "--min_len=50", "--max_len=200"],
        vector_paths=("native",),
        runs={"tost_lr1e-3": ("lra/configs/listops_mini_tost.py", []),
              "tost_lr3e-3": ("lra/configs/listops_mini_tost.py", ["--learning_rate=3e-3"]),
              "softmax_lr1e-3": ("lra/configs/listops_mini_softmax.py", [])}),
}


def environment(path):
    """The environment of a run on vector path `path` (native: this process's own)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if path != "native":
        env["ATEN_CPU_CAPABILITY"] = path
    return env


def capability(path):
    """The vector path PyTorch actually takes under `path` on this CPU (e.g. AVX512)."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    done = subprocess.run([sys.executable, "-c", probe], env=environment(path), capture_output=True, text=True)
    cli.require(done.returncode == 0, f"could not start PyTorch under ATEN_CPU_CAPABILITY={path}: "
                                      f"{done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


def prepare_data(grid, cfg):
    """The grid's data folder (generated when absent) and what identifies and describes it."""
    folder = os.path.join(cfg.data_root, grid["folder"])
    command = [sys.executable, "lra/generate.py", "--task=listops", f"--out_dir={folder}", *grid["generate"]]
    if not os.path.isdir(os.path.join(folder, "listops-1000")):
        print(f"generating {folder}", flush=True)
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        cli.require(done.returncode == 0, f"lra/generate.py failed: {done.stderr.strip()[-300:]}")
    files, sizes, majority = {}, {}, {}
    for split in ("train", "val", "test"):
        path = os.path.join(REPO, folder, "listops-1000", f"basic_{split}.tsv")
        with open(path, "rb") as f:
            files[split] = hashlib.sha256(f.read()).hexdigest()
        data = load_split("listops", split, os.path.join(REPO, folder), say=lambda *a: None)
        sizes[split] = dict(n=len(data), mean_tokens=round(float(data.inputs[0].lengths().mean()), 1),
                            min_tokens=int(data.inputs[0].lengths().min()),
                            max_tokens=int(data.inputs[0].lengths().max()))
        if split == "train":  # the majority-class model: always the most common training label
            label = int(np.bincount(data.labels).argmax())
        majority[split] = round(100 * float((data.labels == label).mean()), 2)
    return dict(dir=folder, command="python " + " ".join(command[1:]), sha256=files, splits=sizes,
                majority_label=label, majority_acc=majority)


def one_run(name, config, extra, seed, path, cfg):
    """`python lra/train.py CONFIG EXTRA --seed=S` on vector path `path`, into a temporary
    out_dir: the figures it logged, its settings and its time."""
    with tempfile.TemporaryDirectory(prefix="listops_runs_") as tmp:
        argv = [config, *extra, f"--seed={seed}"] + ([f"--max_iters={cfg.max_iters}"] if cfg.max_iters else [])
        command = [sys.executable, "lra/train.py", *argv, f"--data_dir={cfg.data_dir}", f"--out_dir={tmp}/run",
                   "--num_threads=1"]
        load, t0 = portable.load_average(), time.time()
        done = subprocess.run(command, cwd=REPO, env=environment(path), capture_output=True, text=True)
        wall = time.time() - t0
        cli.require(done.returncode == 0, f"run {name} seed {seed} ({path}) failed: {done.stdout[-500:]}"
                                          f"{done.stderr[-1500:]}")
        with open(os.path.join(tmp, "run", "log.jsonl")) as f:
            last = [json.loads(line) for line in f if '"val_acc"' in line][-1]
        ckpt = checkpoints.load_checkpoint(os.path.join(tmp, "run", "ckpt.pt"), "lra")  # data, never code
    settings = ckpt["config"]
    return dict(run=name, command="python lra/train.py " + " ".join(argv), seed=seed, vector_path=path,
                attn=settings["attn"], params=sum(v.numel() for v in ckpt["model"].values()),
                iters=last["iter"], batch_size=settings["batch_size"] * settings["gradient_accumulation_steps"],
                learning_rate=settings["learning_rate"], best_val_acc=round(100 * last["best_val_acc"], 2),
                test_acc_at_best_val=round(100 * last["test_acc_at_best_val"], 2), wall_s=round(wall, 1),
                load_average_before=[round(x, 2) for x in load])


def git_commit():
    """The commit the runs measured, and whether the tree had changes."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    if head.returncode != 0:  # not a git checkout (e.g. a copied tree)
        return None, None
    return head.stdout.strip(), bool(dirty.stdout.strip())


def read_results(out, cfg):
    """The results already at `out` (the grids not run now are kept as they are), checked."""
    if not os.path.isfile(out):
        return dict(schema=SCHEMA, grids={})
    fix = "restore it (git checkout, for the committed one), or choose another --out"
    results = atomic.read_json(out, fix)
    cli.require(results.get("schema") == SCHEMA, f"{cfg.out} is not a file this script wrote (schema "
                                                 f"{results.get('schema')!r}): choose another --out")
    with atomic.reading(out, fix):  # what the tables read of each grid, each of its type
        for grid in dict(results["grids"]).values():
            for r in list(grid["runs"]):
                for field in ("seed", "params", "iters", "test_acc_at_best_val", "best_val_acc"):
                    atomic.json_number(r[field], field)
            _ = dict(grid["vector_paths"]), dict(grid["data"])
    return results


def main(argv):
    cfg, given = cli.configure(SETTINGS, argv)
    chosen = cli.name_list("grids", cfg.grids, tuple(GRIDS))
    known = [n for g in chosen for n in GRIDS[g]["runs"]]
    names = known if cfg.runs == "all" else cli.name_list("runs", cfg.runs, known)  # each once: never a run twice
    seed_list = cli.seed_list("seeds", cfg.seeds)
    paths = None if cfg.vector_paths == "grid" else cli.name_list("vector_paths", cfg.vector_paths, VECTOR_PATHS)
    cli.check(cfg, non_negative=("max_iters",))
    out = cfg.out if os.path.isabs(cfg.out) else os.path.join(REPO, cfg.out)
    outputs.claim_output(out, "--out=<another file>")  # one writer, and a place that can be written, before any run
    results = read_results(out, cfg)
    commit, dirty = git_commit()
    for g in chosen:
        grid = GRIDS[g]
        data = prepare_data(grid, cfg)
        cfg.data_dir = data["dir"]
        found = {}  # the vector path each name takes here; one run per distinct path
        for path in paths or grid["vector_paths"]:
            found.setdefault(capability(path), path)
        record = dict(command=" ".join(["python lra/listops_runs.py", *argv]), commit=commit, dirty=dirty,
                      date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), torch=_torch_version(),
                      cpu=_cpu_name(), threads=1, max_iters_override=cfg.max_iters or None,
                      vector_paths={p: cap for cap, p in found.items()}, data=data, complete=False, runs=[])
        results["grids"][g] = record
        t0 = time.time()
        for name in [n for n in names if n in grid["runs"]]:
            config, extra = grid["runs"][name]
            for seed in seed_list:
                for path in found.values():
                    r = one_run(name, config, extra, seed, path, cfg)
                    record["runs"].append(r)
                    print(f"{g} {name} seed {seed} {path}: test {r['test_acc_at_best_val']:.2f} (best val "
                          f"{r['best_val_acc']:.2f}), {r['wall_s']:.0f} s at load {r['load_average_before'][0]:.1f}",
                          flush=True)
                    atomic.write_json(out, results, saved=f"{cfg.out} holds the {len(record['runs'])} run(s) that "
                                                       f"ended, grid {g} marked incomplete (the same command runs "
                                                       "that grid again)")
        record.update(complete=True, wall_s=round(time.time() - t0), load_average_after=list(portable.load_average()))
        atomic.write_json(out, results)
        print(f"{g}: {len(record['runs'])} runs in {record['wall_s']} s; wrote {cfg.out}", flush=True)
    return results


def _torch_version():
    import torch

    return torch.__version__


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        return None


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
