"""
How lra/train.py, lra/generate.py and lra/data.py fail: one test per class of bad input,
parametrized over its members. Each refusal is ONE line that starts with the script's name
and says what to do (every --key it names is a setting of the script it names), and nothing
is written (the listing of the folders involved, with sizes and times, is the same after).

    python -m pytest -q lra/test_lra_errors.py     (CPU, offline, ~15 s)

Everything runs in this process through cli.run_cli (the command line's code path).
"""

import errno
import io
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

os.environ["HF_DATASETS_OFFLINE"] = "1"  # never reach for the network
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import background  # noqa: E402  (the session's scratch: removed however the session ends)

os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(background.SCRATCH, "lra_hf"))

import numpy as np
import pytest
import torch
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from lra import data, generate, train  # noqa: E402
from nanotost import atomic, checkpoints, cli  # noqa: E402

torch.set_num_threads(1)  # on a shared 2-core machine more threads only contend
SCRIPTS = {train: os.path.join(REPO, "lra", "train.py"), generate: os.path.join(REPO, "lra", "generate.py")}
try:  # the shared checker of advice (tests/helpers_advice.py), where this checkout has it
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from helpers_advice import assert_advice_exists
except ImportError:
    assert_advice_exists = None

# a one-layer model, a few steps: every run below takes well under a second
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--mlp_hidden=32", "--batch_size=8", "--n_train=64",
        "--n_eval=16", "--max_len=64", "--pad_multiple=8", "--dropout=0.0", "--log_interval=1000", "--device=cpu",
        "--dtype=float32", "--num_threads=1", "--warmup_iters=0", "--learning_rate=1e-3"]


# -----------------------------------------------------------------------------
# helpers


def snapshot(*roots):
    """Every folder and file under roots (files with size and modification time)."""
    seen = {}
    for root in roots:
        for folder, _, files in os.walk(root):
            seen[folder] = None
            for name in files:
                st = os.stat(os.path.join(folder, name))
                seen[os.path.join(folder, name)] = (st.st_size, st.st_mtime_ns)
    return seen


def check_advice(message, module):
    """Every --key the message names is a setting of the script it belongs to: the script
    itself, or lra/generate.py where the message tells to run it."""
    settings = set(module.DEFAULTS) | (set(generate.DEFAULTS) if "lra/generate.py" in message else set())
    for key in re.findall(r"--(\w+)", message):
        assert key in settings or key == "key", (key, message)  # "--key=value": how settings are written
    if assert_advice_exists is not None:
        assert_advice_exists(message)


def run(module, argv, monkeypatch):
    """run_cli(module.main, argv) as `python lra/<script>.py argv` would: (exit code, message)."""
    monkeypatch.setattr(sys, "argv", [SCRIPTS[module]])
    try:
        cli.run_cli(module.main, list(argv))
    except SystemExit as e:
        return (1, str(e.code)) if isinstance(e.code, str) else (e.code, "")
    return 0, ""


def refused(module, argv, monkeypatch, *roots):
    """The script refuses argv in one line naming itself; nothing under roots changes."""
    before = snapshot(*roots)
    code, message = run(module, argv, monkeypatch)
    name = "lra/" + os.path.basename(SCRIPTS[module])
    assert code == 1 and message.startswith(f"{name}: ") and "\n" not in message, (code, message)
    assert snapshot(*roots) == before, message
    check_advice(message, module)
    return message


@pytest.fixture(scope="module")
def listops(tmp_path_factory):
    """A small generated ListOps set (shallow trees, 64 / 16 / 16 examples)."""
    out = str(tmp_path_factory.mktemp("listops"))
    generate.write_listops(out, n_train=64, n_val=16, n_test=16, seed=0, min_len=10, max_len=60, max_depth=3,
                           max_args=5)
    return out


@pytest.fixture(scope="module")
def finished(listops, tmp_path_factory):
    """A run that reached max_iters=2 (a checkpoint at iter 2, a log)."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    train.main([*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--max_iters=2",
                "--eval_interval=2"])
    return out


def copy_run(finished, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(finished, out)
    return out


# -----------------------------------------------------------------------------
# settings: counts, sizes, choices, floats, device / dtype, config files, out_dir

BAD_CONFIGS = {"syntax.py": b"n_layer = = 2\n", "undefined.py": b"n_layer = 2\nn_embd = width\n",
               "latin1.py": b"n_layer = 2\n# caf\xe9\n"}


def write_bad_files(tmp_path):
    for name, content in BAD_CONFIGS.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "a_file").write_text("not a folder")


CONFIG_CASES = [("{tmp}/syntax.py", "syntax.py:1: "), ("{tmp}/undefined.py", "undefined.py:2: NameError"),
                ("{tmp}/latin1.py", "latin1.py: not UTF-8"), ("{tmp}/absent.py", "not found"),
                ("--out_dir={tmp}/a_file", "is a file, not a folder"),
                ("--out_dir={tmp}/a_file/run", "is a file, not a folder")]


@pytest.mark.parametrize("arg, words", [
    ("--batch_size=0", "batch_size must be at least 1, got 0"),
    ("--n_layer=-1", "n_layer must be at least 1"),
    ("--gradient_accumulation_steps=0", "gradient_accumulation_steps must be at least 1"),
    ("--eval_interval=0", "eval_interval must be at least 1"),
    ("--load_workers=0", "load_workers must be at least 1"),
    ("--max_iters=-5", "max_iters must not be negative"),
    ("--n_train=-1", "n_train must not be negative"),
    ("--layer_scale_init=-1", "layer_scale_init must not be negative"),
    ("--learning_rate=0", "learning_rate must be positive"),
    ("--learning_rate=nan", "learning_rate must be a finite number"),
    ("--weight_decay=inf", "weight_decay must be a finite number"),
    ("--dropout=1", "dropout must be in [0, 1)"),
    ("--min_lr=1", "min_lr (1.0) must not exceed learning_rate"),
    ("--n_head=3", "n_embd (16) must be divisible by n_head (3)"),
    ("--task=listopz", "task must be one of listops, text"),
    ("--lr_schedule=step", "lr_schedule must be one of"),
    ("--init_from=continue", "init_from must be one of scratch, resume, auto, finetune"),
    ("--init_from=finetune", "init_from='finetune' needs --finetune_from="),
    ("--norm=mid", "norm must be one of pre, post"),
    ("--tssa_impl=cuda", "tssa_impl must be one of"),
    ("--max_iters=2.5", "max_iters expects int"),
    ("--n_layers=2", "Did you mean n_layer"),
    ("--dtype=float8", "dtype must be auto or one of"),
    ("--device=tpu", "device must be auto, cpu, cuda, cuda:N or mps"),
    ("--device=cuda", "no CUDA GPU"),
    *CONFIG_CASES,
])
def test_train_settings_are_refused_before_any_work(arg, words, listops, tmp_path, monkeypatch):
    if arg == "--device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    write_bad_files(tmp_path)
    argv = [*TINY, f"--data_dir={listops}", f"--out_dir={tmp_path}/out", f"--cache_dir={tmp_path}/cache",
            arg.format(tmp=tmp_path)]
    message = refused(train, argv, monkeypatch, tmp_path, listops)
    assert words in message


LISTOPS_SMALL = ["--n_train=20", "--n_val=4", "--n_test=4", "--min_len=10", "--max_len=60", "--max_depth=3",
                 "--max_args=5"]


@pytest.mark.parametrize("args, words", [
    (["--n_train=0"], "n_train must be at least 1, got 0"),
    (["--n_val=-3"], "n_val must be at least 1"),
    (["--n_test=0"], "n_test must be at least 1"),
    (["--max_depth=0"], "max_depth must be at least 1"),
    (["--max_args=1"], "max_args must be at least 2"),
    (["--min_len=-1"], "min_len must not be negative"),
    (["--seed=-1"], "seed must be a whole number in 0..4294967295"),
    (["--max_len=5000"], "max_len must be at most 2001"),
    (["--min_len=50", "--max_len=51"], "no ListOps tree has more than min_len (50) and fewer than max_len (51)"),
    (["--max_depth=2", "--max_args=3"], "a tree is one digit or has 4 to 5 tokens"),
    (["--max_depth=1", "--min_len=0"], "only single digits fit these settings"),
    (["--n_train=1.5"], "n_train expects int"),
    (["--parens=maybe"], "parens expects bool"),
    (["--task=sudoku"], "task must be one of listops, pathfinder"),
    (["--task=pathfinder", "--n_images=0"], "n_images must be at least 1"),
    (["--task=pathfinder", "--n_images=9"], "n_images must be at least 10"),
    (["--task=pathfinder", "--per_folder=0"], "per_folder must be at least 1"),
    (["--task=pathfinder", "--workers=-1"], "workers must be in 0.."),
    (["--task=pathfinder", "--size=64"], "size must be one of 32, 128"),
    *[([arg], words) for arg, words in CONFIG_CASES],
])
def test_generator_counts_and_sizes_that_make_no_sense(args, words, tmp_path, monkeypatch):
    write_bad_files(tmp_path)
    argv = [*LISTOPS_SMALL, "--n_images=10", f"--out_dir={tmp_path}/gen", *[a.format(tmp=tmp_path) for a in args]]
    assert words in refused(generate, argv, monkeypatch, tmp_path)


@pytest.mark.parametrize("task", ["listops", "pathfinder"])
def test_generator_never_overwrites_a_set(task, tmp_path, monkeypatch):
    if task == "listops":
        generate.write_listops(str(tmp_path), n_train=4, n_val=2, n_test=2, min_len=3, max_len=20, max_depth=3)
    else:  # a release-like set: only the metadata decides that it is there
        (tmp_path / "pathfinder32" / "curv_contour_length_14" / "metadata").mkdir(parents=True)
        (tmp_path / "pathfinder32" / "curv_contour_length_14" / "metadata" / "0.npy").write_text("imgs/0 a.png 0 1\n")
    message = refused(generate, [f"--task={task}", *LISTOPS_SMALL, "--n_images=10", f"--out_dir={tmp_path}"],
                      monkeypatch, tmp_path)
    assert "already holds a" in message and "--out_dir=<new folder>" in message


def disk_full_at(call, calls, real):
    """atomic.settle (where every file the project writes goes to disk, its bytes written: atomic_write,
    write_together) finding the disk full at its `call`-th use."""
    def failing(f, old):
        calls.append(old)
        if len(calls) == call:
            raise OSError(errno.ENOSPC, "No space left on device")  # (as a flush's error: no file named)
        real(f, old)
    return failing


@pytest.mark.parametrize("task, argv, fail_at", [
    ("listops", LISTOPS_SMALL, 2),  # the second of the three split files
    ("pathfinder", ["--n_images=10", "--per_folder=5", "--workers=1"], 5),  # the fifth image (in this process)
])
def test_a_failed_generator_run_leaves_no_partial_file(task, argv, fail_at, tmp_path, monkeypatch):
    """A disk that fills up mid-run: one line, no partial or temp file, no set that looks whole,
    and no image drawn (ListOps: none of the three files; Pathfinder: none of its images, drawn in
    a folder that takes its name at the end); the same command then succeeds."""
    calls = []
    monkeypatch.setattr(atomic, "settle", disk_full_at(fail_at, calls, atomic.settle))
    code, message = run(generate, [f"--task={task}", *argv, f"--out_dir={tmp_path}/gen"], monkeypatch)
    monkeypatch.undo()
    assert code == 1 and message.startswith("lra/generate.py: No space left on device: ") and "\n" not in message
    assert "free some space or write elsewhere" in message and len(calls) == fail_at
    files = [os.path.join(f, n) for f, _, names in os.walk(tmp_path / "gen") for n in names]
    assert files == [] and ".tmp" not in message, (files, message)  # nothing, and the set meant is named
    code, message = run(generate, [f"--task={task}", *argv, f"--out_dir={tmp_path}/gen"], monkeypatch)
    assert code == 0, message  # a failed run leaves nothing that blocks the next
    assert len(data.load_split(task, "test", str(tmp_path / "gen"))) in (1, 4)  # (pathfinder: 10 cut 80/10/10)


def test_an_interrupted_or_killed_pathfinder_run_leaves_no_image(tmp_path, monkeypatch, capsys):
    """Ctrl-C while Pathfinder's images are drawn: "nothing was saved" is true (no image is left);
    a killed run's drawing (its folder, named for a pid that is gone) goes with the next run."""
    out = tmp_path / "gen"
    argv = ["--task=pathfinder", "--n_images=10", "--per_folder=5", "--workers=1", f"--out_dir={out}"]
    real, drawn = generate.pathfinder_sample, []

    def ctrl_c_at_the_seventh(*args, **kw):
        drawn.append(1)
        if len(drawn) == 7:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(generate, "pathfinder_sample", ctrl_c_at_the_seventh)
    assert run(generate, argv, monkeypatch)[0] == 130
    assert "nothing was saved" in capsys.readouterr().err
    assert [os.path.join(f, n) for f, _, names in os.walk(out) for n in names] == []
    monkeypatch.setattr(generate, "pathfinder_sample", real)
    dead = 2 ** 22 + 17  # (above any pid this machine gave: no process has it)
    killed = out / "pathfinder32" / f".curv_contour_length_14.tmp{dead}" / "imgs" / "0"
    killed.mkdir(parents=True)
    (killed / "sample_0.png").write_bytes(b"half")
    assert run(generate, argv, monkeypatch)[0] == 0
    assert sorted(os.listdir(out / "pathfinder32")) == ["curv_contour_length_14"]


# -----------------------------------------------------------------------------
# checkpoints: another kind, damaged, absent; resume conflicts; a finished run


@pytest.mark.parametrize("mode", ["--init_from=resume", "--eval_only=True"])
@pytest.mark.parametrize("kind, words", [
    ("language", "is a language checkpoint (written by train.py), not an lra one"),
    ("vit", "is a vit checkpoint (written by vit_train.py), not an lra one"),
    ("damaged", "is not a readable checkpoint"),
    ("absent", "no checkpoint at"),
])
def test_a_checkpoint_of_another_kind_is_refused(kind, words, mode, finished, listops, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    if kind in ("language", "vit"):
        torch.save({"kind": kind, "model": {}, "model_args": {}, "iter_num": 5, "config": {}}, out / "ckpt.pt")
    elif kind == "damaged":
        whole = open(os.path.join(finished, "ckpt.pt"), "rb").read()
        (out / "ckpt.pt").write_bytes(whole[:len(whole) // 2])
    argv = [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--max_iters=4", mode]
    assert words in refused(train, argv, monkeypatch, tmp_path)


@pytest.mark.parametrize("arg, words", [
    ("--n_layer=2", "n_layer=2 (checkpoint: 1)"),
    ("--attn=softmax", "attn='softmax' (checkpoint: 'tssa')"),
    ("--task=retrieval", "task='retrieval' (checkpoint: 'listops')"),
    ("--max_len=32", "max_len=32 (checkpoint: 64)"),
    ("--seed=7", "seed=7 (checkpoint: 1337)"),
])
def test_resume_refuses_settings_that_differ_from_the_checkpoint(arg, words, finished, listops, tmp_path, monkeypatch):
    out = copy_run(finished, tmp_path)
    argv = [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--max_iters=4", "--init_from=resume",
            arg]
    message = refused(train, argv, monkeypatch, tmp_path)
    assert "was trained with other settings" in message and words in message


def test_resume_refuses_a_checkpoint_rewritten_while_it_started(finished, listops, tmp_path, monkeypatch):
    """The checkpoint is read before the data, out_dir claimed after: a run that wrote it in
    between (and ended) is not overwritten with older weights."""
    out = copy_run(finished, tmp_path)
    real = train.load_split

    def load_while_another_run_saves(*args, **kw):
        path = os.path.join(out, "ckpt.pt")
        checkpoints.save_checkpoint(checkpoints.load_checkpoint(path, "lra"), path)
        return real(*args, **kw)

    monkeypatch.setattr(train, "load_split", load_while_another_run_saves)
    code, message = run(train, [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--max_iters=4",
                                "--init_from=resume"], monkeypatch)
    assert code == 1 and "was rewritten while this run loaded it" in message and "\n" not in message


@pytest.mark.parametrize("arg, words", [
    ("--init_from=resume", "already reached max_iters=2 (iter 2"),
    ("--init_from=auto", "already reached max_iters=2 (iter 2"),
    ("--eval_only=True", "'test_acc'"),  # scores it, claims and writes nothing
])
def test_a_finished_run_says_so_and_writes_nothing(arg, words, finished, listops, tmp_path, monkeypatch, capsys):
    out = copy_run(finished, tmp_path)
    before = snapshot(tmp_path)
    code, message = run(train, [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--max_iters=2",
                                arg], monkeypatch)
    stdout = capsys.readouterr().out
    assert code == 0 and message == "" and words in stdout, (message, stdout)
    assert snapshot(tmp_path) == before
    if "already reached" in stdout:
        assert "raise --max_iters" in stdout and "--eval_only=True" in stdout


# -----------------------------------------------------------------------------
# a non-finite training loss


@pytest.mark.parametrize("how", ["nan_after_resume", "nan_at_the_first_step", "huge_learning_rate"])
def test_a_non_finite_loss_stops_before_the_update(how, finished, listops, tmp_path, monkeypatch):
    """NaN losses (cross_entropy patched) or an overflow (lr 1e30): one line naming the last
    good checkpoint, which is untouched; with NaN from the start, no optimizer step at all."""
    out = str(tmp_path / "out") if how == "nan_at_the_first_step" else copy_run(finished, tmp_path)
    ckpt = os.path.join(out, "ckpt.pt")
    before = open(ckpt, "rb").read() if os.path.exists(ckpt) else None
    steps = []
    if how.startswith("nan"):
        real_ce, real_step = torch.nn.functional.cross_entropy, torch.optim.AdamW.step

        def nan_in_training(logits, labels, **kw):  # evaluation sums (reduction="sum"): left alone
            loss = real_ce(logits, labels, **kw)
            return loss if kw.get("reduction") == "sum" else loss * float("nan")

        def counted_step(self, *args, **kw):
            steps.append(1)
            return real_step(self, *args, **kw)

        monkeypatch.setattr(torch.nn.functional, "cross_entropy", nan_in_training)
        monkeypatch.setattr(torch.optim.AdamW, "step", counted_step)
        extra = ["--max_iters=6"]
    else:  # the first step throws the weights to ~1e30, the next forward pass overflows
        extra = ["--max_iters=20", "--learning_rate=1e30", "--lr_schedule=constant", "--grad_clip=0"]
    init = "--init_from=scratch" if how == "nan_at_the_first_step" else "--init_from=resume"
    code, message = run(train, [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=",
                                "--eval_interval=100", init, *extra], monkeypatch)
    assert code == 1 and "\n" not in message and message.startswith("lra/train.py: non-finite training loss"), message
    assert "stopped before the update" in message and "--learning_rate" in message
    check_advice(message, train)
    if before is None:
        assert "nothing was saved" in message and not os.path.exists(ckpt)
    else:
        assert f"{ckpt} is the last good checkpoint" in message
        assert open(ckpt, "rb").read() == before  # untouched: still the iter-2 checkpoint
        assert checkpoints.load_checkpoint(ckpt, "lra")["iter_num"] == 2
    if how.startswith("nan"):
        assert steps == [] and f"at iter {2 if before else 0} " in message
    else:
        assert "--grad_clip=1.0" in message  # clipping is off here: the advice names it


# -----------------------------------------------------------------------------
# damaged data: one line with file:line and how to get the file again


def _png(side=32, content=None):
    out = io.BytesIO()
    Image.fromarray(np.zeros((side, side), np.uint8)).save(out, format="PNG")
    return out.getvalue() if content is None else content


def _pathfinder(root, lines=None, image8=None):
    """A 10-image Pathfinder set; lines / image8 replace the metadata or image 8 (in val)."""
    base = root / "pathfinder32" / "curv_contour_length_14"
    (base / "imgs" / "0").mkdir(parents=True)
    (base / "metadata").mkdir()
    for i in range(10):
        if not (i == 8 and image8 == "missing"):
            (base / "imgs" / "0" / f"s{i}.png").write_bytes(image8 if i == 8 and image8 else _png())
    text = "".join(f"imgs/0 s{i}.png {i} {i % 2}\n" for i in range(10))
    (base / "metadata" / "0.npy").write_bytes(lines if lines is not None else text.encode())


HEADER = b"Source\tTarget\n"
ROW = b"( ( ( [MAX 4 ) 3 ) ] )\t4\n"


@pytest.mark.parametrize("case, words", [
    ("listops", (b"", "basic_val.tsv is empty")),
    ("listops", (HEADER, "basic_val.tsv has a header but no examples")),
    ("listops", (b"Src\tTgt\n" + ROW, "basic_val.tsv:1: expected a 'Source<TAB>Target' header")),
    ("listops", (HEADER + ROW + b"( [MIN 2 \xff ] )\t2\n", "basic_val.tsv:3: not UTF-8 text")),
    ("listops", (HEADER + b"( )\t4\n", "basic_val.tsv:2: the source '( )' has no ListOps tokens")),
    ("listops", (HEADER + ROW + b"( [MAX 4 3 ] )\tfour\n", "basic_val.tsv:3: the label 'four' is not an integer")),
    ("listops", ("unreadable", "Permission denied")),
    ("pathfinder", (dict(lines=b"imgs/0 s0.png 0\n"), "0.npy:1: expected 'folder file index label ...'")),
    ("pathfinder", (dict(lines=b"imgs/0 s0.png 0 x\n" * 10), "0.npy:1: the label 'x' is not an integer")),
    ("pathfinder", (dict(image8="missing"), "0.npy:9: names the image")),
    ("pathfinder", (dict(image8=b"\x89PNG\r\n\x1a\n broken"), "s8.png is not a readable image")),
    ("pathfinder", (dict(image8=_png(16)), "s8.png has 256 pixels, not 32 x 32")),
])
def test_damaged_data_is_one_line_naming_the_file(case, words, tmp_path, monkeypatch):
    content, words = words
    root = tmp_path / "data"
    if case == "listops":
        (root / "listops-1000").mkdir(parents=True)
        for split in ("train", "test"):
            (root / "listops-1000" / f"basic_{split}.tsv").write_bytes(HEADER + ROW)
        val = root / "listops-1000" / "basic_val.tsv"
        val.write_bytes(HEADER + ROW if content == "unreadable" else content)
        if content == "unreadable":
            if os.geteuid() == 0:
                pytest.skip("root reads any file, whatever its permissions")
            val.chmod(0)
    else:
        _pathfinder(root, **content)
    argv = [*TINY, f"--task={case}", "--max_len=0", f"--data_dir={root}", f"--out_dir={tmp_path}/out",
            f"--cache_dir={tmp_path}/cache"]
    message = refused(train, argv, monkeypatch, tmp_path)
    assert words in message
    if content != "unreadable":
        assert "lra/generate.py --task=" in message and "--data_dir=<new folder>" in message  # how to replace it


@pytest.mark.parametrize("damage", ["truncated", "not_a_zip", "array_missing", "lengths_disagree"])
def test_a_damaged_cache_file_is_said_and_rebuilt(damage, listops, tmp_path):
    said = []
    cache = str(tmp_path / "cache")
    first = data.load_split("listops", "val", listops, 64, cache, say=said.append)
    (path,) = [os.path.join(cache, f) for f in os.listdir(cache)]
    whole = open(path, "rb").read()
    if damage == "truncated":
        open(path, "wb").write(whole[:len(whole) // 2])
    elif damage == "not_a_zip":
        open(path, "wb").write(b"nonsense" * 100)
    else:
        with np.load(path) as z:
            arrays = dict(z)
        if damage == "array_missing":
            del arrays["labels"]
        else:
            arrays["offsets0"] = arrays["offsets0"][:-1]
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    again = data.load_split("listops", "val", listops, 64, cache, say=said.append)
    assert len(said) == 1 and said[0].startswith(f"the cache file {path} is damaged")
    assert said[0].endswith("rebuilding it")
    assert np.array_equal(again.labels, first.labels) and np.array_equal(again.inputs[0].values, first.inputs[0].values)
    assert open(path, "rb").read() == whole and os.listdir(cache) == [os.path.basename(path)]  # rebuilt, no temp
    data.load_split("listops", "val", listops, 64, cache, say=said.append)
    assert len(said) == 1  # the rebuilt file loads


# -----------------------------------------------------------------------------
# policies


def test_invsqrt_schedule_and_layer_scale_zero_means_none():
    from nanotost.trainkit import get_lr

    cfg = SimpleNamespace(learning_rate=1e-3, min_lr=1e-5, warmup_iters=100, lr_decay_iters=0, max_iters=10**6,
                        lr_schedule="invsqrt")
    assert get_lr(0, cfg) < get_lr(99, cfg) < 1e-3  # warmup
    # lr * sqrt(warmup / it): exactly lr at the end of the warmup, half of it at 4 x warmup
    assert get_lr(100, cfg) == pytest.approx(1e-3, rel=1e-12) and get_lr(400, cfg) == pytest.approx(5e-4, rel=1e-12)
    assert get_lr(10**8, cfg) == 1e-5  # never below min_lr (lr_decay_iters plays no part)
    base, _ = cli.configure(train.DEFAULTS, [])
    scaled, _ = cli.configure(train.DEFAULTS, ["--layer_scale_init=1e-5"])
    assert train.model_config(base).layer_scale_init is None
    assert train.count_params(scaled) > train.count_params(base)  # the layer scales exist only when asked for


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_an_interrupt_at_the_checkpoints_rename_names_the_iteration_the_file_holds(listops, tmp_path, monkeypatch,
                                                                                    capsys, before):
    """SIGTERM (Ctrl-C's interrupt) just before or just after the second checkpoint's rename: the line names the
    iteration ckpt.pt holds (the file and what an interrupt says change in one step)."""
    from helpers_signals import interrupt_at_rename
    out = str(tmp_path / "out")
    interrupt_at_rename(monkeypatch, "ckpt.pt", 2, before)
    code, _ = run(train, [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--eval_interval=1",
                          "--max_iters=100"], monkeypatch)
    err = capsys.readouterr().err.strip()
    said = re.fullmatch(r"lra/train\.py: interrupted; \S+ holds iter (\d+); continue with .*", err)
    assert code == 130 and said, err
    assert int(said.group(1)) == checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "lra")["iter_num"] == 2


def test_a_held_out_dir_refuses_and_an_interrupt_says_what_was_saved(listops, tmp_path, monkeypatch, capsys):
    """While out_dir is claimed (trainkit's flock, taken by another process as a live run takes
    it) a second run refuses in one line. Ctrl-C (KeyboardInterrupt, which run_cli also makes of SIGTERM)
    after a few saves exits 130 with one line naming the checkpoint and its iteration; the
    printed command continues the run. In this process: the lock and the signal are
    trainkit's, what is checked here is what lra/train.py tells them."""
    out = str(tmp_path / "out")
    argv = [*TINY, f"--data_dir={listops}", f"--out_dir={out}", "--cache_dir=", "--eval_interval=1",
            "--max_iters=100"]
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from nanotost import outputs; outputs.claim_output(sys.argv[1], 'x', folder=True); "
                               "print('held', flush=True); sys.stdin.read()", out], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        message = refused(train, argv, monkeypatch, tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert f"{out} is in use by another run" in message
    real = train.batch_indices

    def ctrl_c_at_step_4(n, batch_size, it, seed):
        if it == 4:
            raise KeyboardInterrupt
        return real(n, batch_size, it, seed)

    monkeypatch.setattr(train, "batch_indices", ctrl_c_at_step_4)
    code, _ = run(train, argv, monkeypatch)
    (line,) = capsys.readouterr().err.strip().splitlines()
    ckpt = os.path.join(out, "ckpt.pt")
    assert code == 130 and checkpoints.load_checkpoint(ckpt, "lra")["iter_num"] == 4  # saved at 1, 2, 3, 4
    assert line == f"lra/train.py: interrupted; {ckpt} holds iter 4; continue with the same command and --init_from=resume"
    monkeypatch.setattr(train, "batch_indices", real)
    result = train.main([*argv[:-1], "--max_iters=5", "--init_from=resume"])
    assert result["iter"] == 5 and checkpoints.load_checkpoint(ckpt, "lra")["iter_num"] == 5
