"""
Issue 17: every script fails the same way, one clear line and nothing lost. One test per
class of fault, parametrized over its members; the scripts' own files hold the members that
only they have (tests/test_prepare_errors.py, tests/test_vit_errors.py, lra/test_lra_errors.py).

    python -m pytest -q tests/test_errors.py

Each refusal is checked the same way (refused()): exit status 1, ONE line that starts with
the script's name, no traceback, every command and --option it suggests exists
(helpers_advice), and nothing written (the folder listing before == after).
"""

import importlib
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanotost import checkpoints, cli  # noqa: E402
from helpers_advice import assert_advice_exists  # noqa: E402
from helpers_signals import default_signals, interrupt_at_rename  # noqa: E402

CONFIGURED = ["train.py", "sample.py", "evaluate.py", "vit_train.py", "vit_inspect.py", "lm_inspect.py", "bench.py",
              "lra/train.py", "lra/generate.py"]  # the scripts that read config files
TINY = ["--dataset=tiny_char", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=4",
        "--gradient_accumulation_steps=1", "--eval_iters=2", "--log_interval=100", "--num_threads=1",
        "--device=cpu", "--dtype=float32", "--warmup_iters=2"]


def module_of(script):
    return importlib.import_module(script[:-3].replace("/", "."))


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def call(script, *argv, monkeypatch=None):
    """run_cli(main, argv) in this process; returns (exit code, stderr text of the refusal)."""
    main = module_of(script).main
    takes_argv = bool(inspect.signature(main).parameters)
    if not takes_argv:
        monkeypatch.setattr(sys, "argv", [script, *argv])
    old = sys.argv[0]
    sys.argv[0] = script  # run_cli names the script by argv[0]
    try:
        cli.run_cli(main, *([list(argv)] if takes_argv else []))
        return 0, ""
    except SystemExit as e:
        return (1, e.code) if isinstance(e.code, str) else (e.code, "")
    finally:
        sys.argv[0] = old


def refused(script, *argv, root, monkeypatch=None, contains=()):
    """The call is refused the one way, writing nothing under root. Returns the message."""
    before = listing(root)
    code, message = call(script, *argv, monkeypatch=monkeypatch)
    assert code == 1, (code, message)
    assert message.count("\n") == 0 and message.startswith(script + ": "), message
    assert "Traceback" not in message
    for text in contains:
        assert text in message, message
    assert_advice_exists(message)
    assert listing(root) == before, "a refusal wrote something"
    return message


def write_tiny_char(root, splits, command="-"):
    """root/data/tiny_char: a character-level dataset as prepare_char.py writes it, 20 characters,
    splits ({split: tokens}) of random ids (each split its own seed)."""
    folder = root / "data" / "tiny_char"
    folder.mkdir(parents=True)
    for i, (split, n) in enumerate(splits.items()):
        np.random.default_rng(i).integers(0, 20, n).astype(np.uint16).tofile(folder / f"{split}.bin")
    (folder / "meta.json").write_text(json.dumps(dict(dataset="tiny_char", tokenizer="char", vocab_size=20,
                                                      chars="abcdefghijklmnopqrst", splits=splits, command=command)))


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A tiny character-level dataset (as prepare_char.py writes it), the cwd in tmp_path."""
    monkeypatch.chdir(tmp_path)
    write_tiny_char(tmp_path, {"train": 4000, "val": 1000}, "python prepare_char.py --input=tiny.txt --name=tiny_char")
    return tmp_path


@pytest.fixture
def trained(data):
    """A run of 4 iterations in out/ (checkpoint at iter 4)."""
    assert call("train.py", *TINY, "--out_dir=out", "--max_iters=4", "--eval_interval=2")[0] == 0
    return data


# -----------------------------------------------------------------------------
# 1. settings: config files that do not run, and values that cannot be right


CONFIG_FILES = {  # name -> (bytes, what the message must say)
    "syntax": (b"n_layer = 4\nlearning_rate = (\n", ["bad.py:2"]),
    "undefined_name": (b"n_layer = 4\nmax_iters = steps * 2\n", ["bad.py:2", "NameError"]),
    "not_utf8": (b"n_layer = 4\n# caf\xe9\n", ["not UTF-8"]),
    "not_python": (b"\x89PNG\r\n\x1a\n\x00\x00", ["bad.py"]),
    "raises": (b"import nonexistent_module_xyz\n", ["bad.py:1", "ModuleNotFoundError"]),
}


@pytest.mark.parametrize("kind", sorted(CONFIG_FILES))
@pytest.mark.parametrize("script", CONFIGURED)
def test_a_config_file_that_does_not_run_is_one_line_with_file_and_line(script, kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    content, expected = CONFIG_FILES[kind]
    (tmp_path / "bad.py").write_bytes(content)
    refused(script, "bad.py", root=tmp_path, monkeypatch=monkeypatch, contains=expected)


@pytest.mark.parametrize("script", CONFIGURED)
def test_help_lists_the_settings(script, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert call(script, "--help", monkeypatch=monkeypatch)[0] == 0
    assert "Settings (defaults):" in capsys.readouterr().out and listing(tmp_path) == []


@pytest.mark.parametrize("script", CONFIGURED)
def test_a_folder_or_missing_file_as_config_is_one_line(script, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.py").mkdir()
    refused(script, "folder.py", root=tmp_path, monkeypatch=monkeypatch, contains=["folder.py"])
    refused(script, "missing.py", root=tmp_path, monkeypatch=monkeypatch, contains=["missing.py", "not found"])


@pytest.mark.parametrize("script", CONFIGURED)
@pytest.mark.parametrize("arg", ["--device=tpu", "--dtype=float8", "--seed=nan", "--no_such_setting=1", "--device"])
def test_common_bad_values_are_refused_before_any_work(script, arg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = module_of(script)
    key = arg[2:].partition("=")[0]
    defaults = cli.config_defaults(vars(module))
    if key in ("device", "dtype", "seed") and key not in defaults:
        pytest.skip(f"{script} has no {key} setting")
    refused(script, arg, root=tmp_path, monkeypatch=monkeypatch)


LANGUAGE_BAD_VALUES = [
    ("train.py", "--eval_interval=0"), ("train.py", "--batch_size=-1"), ("train.py", "--dropout=1.5"),
    ("train.py", "--learning_rate=inf"), ("train.py", "--init_from=never"), ("train.py", "--lr_schedule=step"),
    ("train.py", "--n_embd=30"), ("train.py", "--min_lr=1.0"), ("train.py", "--beta2=1.0"),
    ("train.py", "--block_size=100000"), ("train.py", "--gradient_accumulation_steps=0"),
    ("sample.py", "--num_samples=0"), ("sample.py", "--temperature=-1"), ("sample.py", "--top_k=-5"),
    ("sample.py", "--max_new_tokens=-1"), ("sample.py", "--cuda_graph=graph"), ("evaluate.py", "--batch_size=0"),
    ("evaluate.py", "--stride=-1"), ("evaluate.py", "--split=holdout"), ("evaluate.py", "--tssa_impl=cuda"),
]


@pytest.mark.parametrize("script,arg", LANGUAGE_BAD_VALUES)
def test_language_settings_are_checked_before_any_work(script, arg, trained):
    refused(script, "--out_dir=out", "--dataset=tiny_char", arg, root=trained)


# -----------------------------------------------------------------------------
# 2. the file system


@pytest.mark.parametrize("where", ["out_dir_is_a_file", "out_dir_under_a_file"])
def test_out_dir_that_cannot_be_a_folder_is_one_line(where, data):
    (data / "afile").write_text("not a folder")
    out = "afile" if where == "out_dir_is_a_file" else "afile/run"
    refused("train.py", *TINY, f"--out_dir={out}", "--max_iters=2", root=data, contains=["afile", "folder"])


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(trained, monkeypatch):
    before = (trained / "out" / "ckpt.pt").read_bytes()

    def no_space(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError(28, "No space left on device")  # errno.ENOSPC

    monkeypatch.setattr(torch, "save", no_space)
    code, message = call("train.py", *TINY, "--out_dir=out", "--max_iters=6", "--eval_interval=2",
                         "--init_from=resume")
    assert code == 1 and message.count("\n") == 0 and "No space left on device" in message, message
    assert "free some space" in message
    assert (trained / "out" / "ckpt.pt").read_bytes() == before  # the old checkpoint, whole
    assert sorted(os.listdir(trained / "out")) == ["ckpt.pt", "log.jsonl"]  # no temp file left


@pytest.mark.parametrize("at", [1, 2, 5])
def test_an_interrupt_while_saving_is_an_interrupt_and_keeps_the_previous_checkpoint(trained, monkeypatch, capsys, at):
    """Ctrl-C (or SIGTERM, which run_cli makes the same) at any write of a save: torch's writer
    turns it into a RuntimeError ("unexpected pos"), which is an interrupt, never a full disk."""
    before, save = (trained / "out" / "ckpt.pt").read_bytes(), torch.save

    class Interrupted(io.RawIOBase):  # the checkpoint's file, interrupted at its at-th write
        def __init__(self, f):
            self.f, self.writes = f, 0

        def writable(self):
            return True

        def write(self, b):
            self.writes += 1
            if self.writes == at:
                raise KeyboardInterrupt
            return self.f.write(b)

    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: save(obj, Interrupted(f), *a, **k))
    code, _ = call("train.py", *TINY, "--out_dir=out", "--max_iters=6", "--eval_interval=2", "--init_from=resume")
    err = capsys.readouterr().err.strip()
    assert code == 130 and err.startswith("train.py: interrupted;") and "space" not in err, err
    assert (trained / "out" / "ckpt.pt").read_bytes() == before  # the old checkpoint, whole
    assert sorted(os.listdir(trained / "out")) == ["ckpt.pt", "log.jsonl"]  # no temp file left


# -----------------------------------------------------------------------------
# 3 and 4. interrupts and a second run into a live run's out_dir


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_says_what_was_saved_and_a_live_out_dir_is_locked(sig, data):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, os.path.join(REPO, "train.py"), *TINY, "--out_dir=out", "--max_iters=100000",
           "--eval_interval=2"]
    proc = subprocess.Popen(cmd, cwd=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_signals)  # SIGINT as from a terminal, however pytest was started
    try:
        for line in proc.stdout:  # wait for the first checkpoint
            if line.startswith("saved"):
                break
        # 4. the run is alive: a second run into its out_dir refuses (with scratch AND resume)
        for init in ("scratch", "resume"):
            message = refused("train.py", *TINY, "--out_dir=out", f"--init_from={init}", root=data / "data")
            assert "in use by another run" in message
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: interrupted;") and "holds iter" in lines[0], (err, rest)
    assert "--init_from=resume" in lines[0]
    ckpt = checkpoints.load_checkpoint("out/ckpt.pt", "language")
    # the lock went with the process: resuming works and continues from the saved iteration
    assert call("train.py", *TINY, "--out_dir=out", f"--max_iters={ckpt['iter_num'] + 2}", "--eval_interval=2",
                "--init_from=resume")[0] == 0
    assert checkpoints.load_checkpoint("out/ckpt.pt", "language")["iter_num"] == ckpt["iter_num"] + 2


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_an_interrupt_at_the_checkpoints_rename_names_the_iteration_the_file_holds(data, monkeypatch, capsys, before):
    """What the interrupt's line says is left behind and what ckpt.pt holds change in one step:
    SIGTERM (Ctrl-C's interrupt) just before or just after the second checkpoint's rename names the file's iteration."""
    interrupt_at_rename(monkeypatch, "ckpt.pt", 2, before)
    code, _ = call("train.py", *TINY, "--out_dir=out", "--max_iters=100", "--eval_interval=2")
    err = capsys.readouterr().err.strip()
    said = re.fullmatch(r"train\.py: interrupted; \S+ holds iter (\d+); continue with .*", err)
    assert code == 130 and said, err
    assert int(said.group(1)) == checkpoints.load_checkpoint("out/ckpt.pt", "language")["iter_num"] == 4


# -----------------------------------------------------------------------------
# 5. resume: settings that conflict with the checkpoint, a run that is done


@pytest.mark.parametrize("arg,key", [("--n_layer=3", "n_layer"), ("--attn=softmax", "attn"),
                                     ("--n_embd=32", "n_embd"), ("--seed=7", "seed")])
def test_resume_refuses_settings_that_differ_from_the_checkpoint(arg, key, trained):
    message = refused("train.py", *TINY, "--out_dir=out", "--max_iters=8", "--init_from=resume", arg, root=trained)
    assert f"{key}=" in message and "checkpoint:" in message


def test_resume_on_another_tokenizer_and_a_finished_run(trained, capsys):
    other = trained / "data" / "other_char"
    other.mkdir()
    for f in ("train.bin", "val.bin"):
        (other / f).write_bytes((trained / "data" / "tiny_char" / f).read_bytes())
    meta = json.loads((trained / "data" / "tiny_char" / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps(dict(meta, chars="ABCDEFGHIJKLMNOPQRST", dataset="other_char")))
    argv = [a for a in TINY if not a.startswith("--dataset")]
    refused("train.py", *argv, "--dataset=other_char", "--out_dir=out", "--max_iters=8", "--init_from=resume",
            root=trained, contains=["dataset="])
    # the same command as the finished run: one line that says so, exit 0, nothing written
    before = listing(trained)
    assert call("train.py", *TINY, "--out_dir=out", "--max_iters=4", "--init_from=auto")[0] == 0
    assert "already reached max_iters=4" in capsys.readouterr().out
    assert listing(trained) == before


def test_a_resume_without_dataset_reads_the_checkpoints(trained):
    """The checkpoint is read before the data: a resume opens the dataset it was trained on
    (tiny_char), not the default one (openwebtext, which is not prepared here)."""
    argv = [a for a in TINY if not a.startswith("--dataset")]
    assert call("train.py", *argv, "--out_dir=out", "--max_iters=6", "--eval_interval=2", "--init_from=resume")[0] == 0
    assert checkpoints.load_checkpoint("out/ckpt.pt", "language")["iter_num"] == 6


# -----------------------------------------------------------------------------
# 6. the wrong kind of checkpoint


@pytest.mark.parametrize("kind", ["vit", "lra"])
@pytest.mark.parametrize("script,extra", [("train.py", TINY + ["--init_from=resume"]), ("sample.py", []),
                                          ("evaluate.py", ["--dataset=tiny_char"])])
def test_a_checkpoint_of_another_kind_is_one_line(script, extra, kind, data):
    os.makedirs("out")
    torch.save({"kind": kind, "model": {}, "model_args": {}, "config": {}, "iter_num": 1}, "out/ckpt.pt")
    refused(script, *extra, "--out_dir=out", root=data, contains=[f"a {kind} checkpoint", "language"])


# -----------------------------------------------------------------------------
# 8. input data: sample.py's prompt file


@pytest.mark.parametrize("prompt,expected", [("FILE:missing.txt", "missing.txt"), ("FILE:afolder", "afolder"),
                                             ("FILE:latin1.txt", "not UTF-8"), ("FILE:empty.txt", "prompt is empty"),
                                             ("ABC", "not in this model's vocabulary")])
def test_a_prompt_that_cannot_be_read_is_one_line(prompt, expected, trained):
    (trained / "afolder").mkdir()
    (trained / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (trained / "empty.txt").write_text("")
    refused("sample.py", "--out_dir=out", f"--start={prompt}", "--max_new_tokens=2", root=trained,
            contains=[expected])


# -----------------------------------------------------------------------------
# 7. damaged prepared data


def _truncate(folder):
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(2001)  # an odd byte count: not uint16 tokens


def _short_val(folder):
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(1000)  # 500 tokens where meta.json says 1000


def _big_id(folder):
    np.full(1000, 65535, dtype=np.uint16).tofile(folder / "val.bin")


def _garbled_meta(folder):
    (folder / "meta.json").write_text("{not json")


def _meta_without_splits(folder):
    (folder / "meta.json").write_text(json.dumps({"tokenizer": "char", "vocab_size": 20}))


DAMAGE = {"odd_byte_count": _truncate, "size_against_meta": _short_val, "id_outside_vocab": _big_id,
          "unreadable_meta": _garbled_meta, "meta_missing_keys": _meta_without_splits}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("script", ["train.py", "evaluate.py"])
def test_damaged_prepared_data_names_the_command_that_re_prepares(script, damage, trained):
    """(The val split is damaged: both scripts read it.) The command is the one meta.json
    records, with --force; where meta.json cannot be read, the one a dataset of its name needs."""
    DAMAGE[damage](trained / "data" / "tiny_char")
    args = ["--out_dir=new", *TINY, "--max_iters=2"] if script == "train.py" else ["--out_dir=out", "--dataset=tiny_char"]
    if damage in ("unreadable_meta", "meta_missing_keys"):
        redo = "python prepare_char.py --input=<text file> --name=tiny_char --force"
    else:  # quoted from meta.json
        redo = "python prepare_char.py --input=tiny.txt --name=tiny_char --force"
    refused(script, *args, root=trained, contains=[f"prepare it again: {redo}"])
