"""
Issue 26: the classes of fault the error mechanism (cli.run_cli, cli.check, trainkit's atomic
writes and checkpoints) still missed, one parametrized test per class. Where the members can be
found from the scripts themselves (their settings, their default outputs, the readers of a
checkpoint), they are, so that a new script or setting is tested without being listed here.

  1. numbers: every int / float setting of every script has a declared range (cli.check refuses
     a script that leaves one out); each value just outside it, and int64's end, is one line,
     exit 1, nothing written; a tiny temperature samples greedily (never nan)
  3. a full disk while a checkpoint is written: one line naming the file, the old one whole
  4. silently wrong data: every Pillow mode through both image readers (vit_data, lra/data);
     data prepared again under a live run stops it, its checkpoint intact
  5. side writes after the result: evaluate.py prints its score and saves it where --out says
     (a folder it cannot write costs a warning, never the score); package caches that cannot be
     written are named with the variable that moves them
  6. no default output of any script is a file the repository tracks
  7. a checkpoint of an older layout (nanoGPT's), or whose weights are not this version's: one
     line, in every script that reads one
  8. what a resumed or long run says: log.jsonl holds each iteration once after an interrupt and
     a resume (all three trainers); the command that continues is the one that applies; long
     work shows progress and sizes its workers by the machine; ratios read as worded; an
     unreachable Hub fails at once; output into a reader that went away (| head) ends quietly

Class 2 (the lm-eval adapter) is in tests/test_harness.py, whitespace corpora (class 4) in
tests/test_prepare_errors.py. In this process through cli.run_cli, tiny runs; about 30 s.

    python -m pytest -q tests/test_error_classes.py
"""

import errno
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from results.benchkit import report as bench_report  # noqa: E402
from results.benchkit import suites as bench_suites  # noqa: E402
import model  # noqa: E402
from helpers_advice import assert_advice_exists  # noqa: E402
from lra import data as lra_data  # noqa: E402
from lra import generate as lra_generate  # noqa: E402
from nanotost import checkpoints, cli, devices, vit_data
from nanotost import textdata as td
from nanotost import trainkit as tk  # noqa: E402
from test_errors import TINY, call, data, refused, trained  # noqa: E402,F401  (data, trained: fixtures)

torch.set_num_threads(1)  # tiny models on a shared machine


# -----------------------------------------------------------------------------
# the scripts, found: every entry script that reads settings through cli.configure or
# textdata.ArgumentParser


def entry_scripts():
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "out", "data", "tests", "__")))
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            reads_settings = "cli.configure(" in text or "cli.ArgumentParser(" in text
            if re.search(r"__name__ == .__main__.", text) and reads_settings:
                found.append(os.path.relpath(path, REPO))
    return found


SCRIPTS = entry_scripts()


def module_of(script):
    return importlib.import_module(script[:-3].replace("/", "."))


class Declared(Exception):
    """Raised by the recording cli.check below, once it has checked (before any work)."""


def declared(script):
    """(settings, kinds) of a script run with its defaults: what it gave cli.check. The real
    check runs first, so a number without a kind fails here (AssertionError)."""
    real, seen = cli.check, {}

    def record(C, **kinds):
        real(C, **kinds)
        seen.update(settings=vars(C).copy(), kinds=kinds)
        raise Declared

    cli.check = record
    try:
        module_of(script).main([])
    except Declared:
        return seen["settings"], seen["kinds"]
    finally:
        cli.check = real
    raise AssertionError(f"{script} never called cli.check")


def outside(settings, kinds):
    """(key, value) just outside each declared range, and int64's end for every whole number."""
    cases = [(k, 0) for k in kinds.get("at_least_1", ())] + [(k, -1) for k in kinds.get("non_negative", ())]
    cases += [(k, 0) for k in kinds.get("positive", ())]
    cases += [(k, v) for k in kinds.get("fraction", ()) for v in (-0.5, 1)]
    cases += [(k, v) for k in kinds.get("seed", ()) for v in (-1, cli.SEED_MAX + 1)]
    cases += [(k, v) for k in kinds.get("workers", ()) for v in (-1, cli.MAX_WORKERS + 1)]
    for key, (low, high) in (kinds.get("between") or {}).items():
        step = 1 if isinstance(settings[key], int) else 0.5
        cases += [(key, low - step), (key, high + step)]
    for key, allowed in (kinds.get("choices") or {}).items():
        numbers = [v for v in allowed if isinstance(v, (int, float)) and not isinstance(v, bool)]
        cases += [(key, max(numbers) + 1)] if numbers else []
    cases += [(k, v) for k, v0 in settings.items() if type(v0) is int for v in (2**64, -2**64)]
    return sorted(set(cases), key=str)


DECLARED = {script: declared(script) for script in SCRIPTS}


def test_the_scripts_are_found():
    assert {"train.py", "sample.py", "evaluate.py", "vit_train.py", "lra/train.py", "lra/generate.py", "bench.py",
            "prepare_char.py", "prepare_openwebtext.py"} <= set(SCRIPTS)


def test_check_refuses_a_number_without_a_range():
    """The mechanism: a script that leaves a number out of cli.check is a bug, not a user's error."""
    C = SimpleNamespace(steps=3, rate=0.1, name="x", on=True)
    with pytest.raises(AssertionError, match="rate"):
        cli.check(C, at_least_1=("steps",))
    cli.check(C, at_least_1=("steps",), fraction=("rate",))  # (strings and booleans need no range)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_number_of_every_script_has_a_declared_range(script):
    settings, kinds = DECLARED[script]  # (declared() fails on a number without a kind)
    numbers = {k for k, v in settings.items() if type(v) in (int, float)}
    named = {k for kind, keys in kinds.items() if kind != "dashes" for k in keys}
    assert numbers <= named


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_number_out_of_its_range_is_one_line_before_any_work(script, tmp_path, monkeypatch):
    """Each value just outside a declared range (about 30 per script, 370 in all), one by one."""
    monkeypatch.chdir(tmp_path)
    for key, value in outside(*DECLARED[script]):
        message = refused(script, f"--{key}={value}", root=tmp_path, monkeypatch=monkeypatch)
        assert key in message, (key, value, message)


SEED_LISTS = [script for script in SCRIPTS if isinstance(DECLARED[script][0].get("seeds"), str)]


@pytest.mark.parametrize("script", SEED_LISTS)
@pytest.mark.parametrize("seeds", ["-1", "1,4294967296", "1,x", "2,2", ""])
def test_the_seeds_inside_a_list_setting_get_a_seeds_range(script, seeds, tmp_path, monkeypatch):
    """A number inside a text setting ("1337,1338") is range-checked as a number setting is:
    before any run starts, not by the first run it reaches (results/compare/pydocs.py, lra/listops_runs.py)."""
    monkeypatch.chdir(tmp_path)
    assert "seeds" in refused(script, f"--seeds={seeds}", root=tmp_path, monkeypatch=monkeypatch)


def test_the_seed_list_scripts_are_found():
    assert {"results/compare/pydocs.py", "lra/listops_runs.py"} <= set(SEED_LISTS)


def test_the_one_line_is_what_the_command_line_prints(tmp_path):
    """The same path through the interpreter: train.py --seed=-1 (numpy refused it deep inside)."""
    run = subprocess.run([sys.executable, os.path.join(REPO, "train.py"), "--seed=-1"], cwd=tmp_path,
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 1 and run.stdout == "" and os.listdir(tmp_path) == []
    assert run.stderr.strip().splitlines() == ["train.py: seed must be a whole number in 0..4294967295 (2**32 - 1, "
                                               "what numpy and torch take), got -1"]


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-46, 1e-40, 1e-12, 1e-4])
def test_a_tiny_temperature_samples_greedily(temperature):
    """logits / T overflows for a tiny T (inf - inf = nan in the softmax); the largest logit moved
    to 0 first, a tiny T is the argmax, with top_k or without; a T that float32 rounds to 0
    (1e-46, 1e-300, the smallest float64) would be 0 / 0: it is the argmax too."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 30  # (B, V), distinct maxima
    for top_k in (None, 5):
        assert torch.equal(model.sample_token(logits, temperature, top_k), logits.argmax(-1, keepdim=True))
    assert torch.equal(model.sample_token(logits.bfloat16(), 1e-40), logits.bfloat16().argmax(-1, keepdim=True))


def test_sample_py_at_a_tiny_temperature_writes_the_greedy_text(trained, capsys):
    texts = {}
    for temperature in ("0", "1e-40", "1e-300"):
        assert call("sample.py", "--out_dir=out", "--start=abc", f"--temperature={temperature}",
                    "--max_new_tokens=20", "--num_samples=2")[0] == 0
        texts[temperature] = capsys.readouterr().out.split("-" * 60)[1:-1]
    assert texts["0"] == texts["1e-40"] == texts["1e-300"] and len(texts["0"]) == 2


# -----------------------------------------------------------------------------
# 3. a full disk while torch.save writes a checkpoint


def writer_stops(obj, f, *args, **kwargs):
    """torch.save into a file whose writes stop with ENOSPC after 1 kB: torch reports it as its
    own RuntimeError ("unexpected pos"), the OSError only its context."""
    class Full(io.RawIOBase):
        written = 0

        def writable(self):
            return True

        def write(self, b):
            Full.written += len(b)
            f.write(bytes(b))
            if Full.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")  # no file name: torch's writer had none
            return len(b)

    return REAL_SAVE(obj, Full(), *args, **kwargs)


def writer_error_alone(obj, f, *args, **kwargs):
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


REAL_SAVE = torch.save
DISK_FULL = {  # how a full disk reaches save_checkpoint -> what patches it
    "torch_writer_with_the_os_error": lambda mp: mp.setattr(torch, "save", writer_stops),
    "torch_writer_alone": lambda mp: mp.setattr(torch, "save", writer_error_alone),
    "enospc_without_a_file_name": lambda mp: mp.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device"))),
    "no_room_before_writing": lambda mp: mp.setattr(shutil, "disk_usage", lambda p: SimpleNamespace(free=1000)),
}


@pytest.mark.parametrize("how", sorted(DISK_FULL))
def test_a_full_disk_while_saving_names_the_file_and_keeps_the_old_one(how, tmp_path, monkeypatch):
    path = str(tmp_path / "out" / "ckpt.pt")
    checkpoints.save_checkpoint({"model": {"w": torch.zeros(300)}}, path)
    before = open(path, "rb").read()
    DISK_FULL[how](monkeypatch)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as stop:
        cli.run_cli(checkpoints.save_checkpoint, {"model": {"w": torch.ones(1000)}}, path)
    monkeypatch.undo()
    message = stop.value.code
    assert message.startswith("train.py: No space left on device") and f"'{path}'" in message, message
    assert "\n" not in message and message.endswith("free some space or write elsewhere")
    assert open(path, "rb").read() == before and os.listdir(tmp_path / "out") == ["ckpt.pt"]  # no temp file


def test_a_full_disk_inside_torch_save_ends_a_run_in_one_line(trained, monkeypatch):
    before = (trained / "out" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(torch, "save", writer_stops)
    code, message = call("train.py", *TINY, "--out_dir=out", "--max_iters=6", "--eval_interval=2", "--init_from=auto")
    assert code == 1 and message.startswith("train.py: No space left on device: ") and "out/ckpt.pt" in message
    assert (trained / "out" / "ckpt.pt").read_bytes() == before


@pytest.mark.parametrize("error,expected", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device: free some space or write elsewhere"),
    (OSError(errno.ENOSPC, "No space left on device", "/d/x"), "No space left on device: '/d/x': free some space"),
])
def test_an_os_error_line_has_no_empty_place(error, expected):
    assert cli.os_error_line(error).startswith(expected) and "::" not in cli.os_error_line(error)


@pytest.mark.parametrize("script", ["train.py", "vit_train.py"])
def test_an_out_dir_that_is_a_file_says_a_folder_is_expected(script, data, tmp_path, monkeypatch):
    """os.makedirs over a file raises EEXIST ("File exists"), which said only "check the path"."""
    (tmp_path / "taken").write_text("a file")
    argv = TINY if script == "train.py" else ["--max_iters=1"]
    message = refused(script, *argv, "--out_dir=taken", root=tmp_path, monkeypatch=monkeypatch)
    assert "'taken'" in message and "not a folder" in message, message
    error = FileExistsError(errno.EEXIST, "File exists", str(tmp_path / "taken"))
    assert "not a folder" in cli.os_error_line(error)
    error.filename = str(tmp_path)  # EEXIST on a folder is not this case
    assert "not a folder" not in cli.os_error_line(error)


# -----------------------------------------------------------------------------
# 4. every Pillow mode through both image readers; data that changes under a run

RAMP = np.tile(np.linspace(0, 1, 32), (8, 1))  # (H, W): dark on the left, bright on the right
MODES = {  # mode -> (file format, image holding the ramp)
    "1": ("PNG", lambda: Image.fromarray(RAMP >= 0.5)),  # (a threshold: convert("1") would dither)
    "L": ("PNG", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8))),
    "P": ("PNG", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("P")),
    "LA": ("PNG", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("LA")),
    "RGB": ("PNG", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("RGB")),
    "RGBA": ("PNG", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("RGBA")),
    "PA": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("PA")),
    "CMYK": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("CMYK")),
    "YCbCr": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("RGB").convert("YCbCr")),
    "LAB": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 255).astype(np.uint8)).convert("RGB").convert("LAB")),
    "I;16": ("PNG", lambda: Image.fromarray(np.round(RAMP * 65535).astype(np.uint16))),
    "I;16B": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 65535).astype(">u2"))),  # (convert() clips it)
    "I": ("TIFF", lambda: Image.fromarray(np.round(RAMP * 65535).astype(np.int32))),
    "F": ("TIFF", lambda: Image.fromarray(RAMP.astype(np.float32))),
}


@pytest.mark.parametrize("reader", ["vit_data", "lra/data"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_image_mode_keeps_what_it_shows_or_is_refused(mode, reader, tmp_path):
    """Both readers see the ramp's grey levels (within 3 of 255 x the ramp: palettes, CMYK and
    LAB round a little; 1-bit is a threshold) in every mode, deeper ones scaled, never clipped
    to white; float pixels (no standard range) are refused in one line naming the file."""
    kind, make = MODES[mode]
    path = tmp_path / f"img.{kind.lower()}"
    make().save(path, format=kind)
    with Image.open(path) as back:
        assert back.mode == mode  # the file holds the mode under test
    if mode == "F":
        with pytest.raises(cli.UserError, match=re.escape(str(path)) + ".*float"):
            if reader == "vit_data":
                vit_data.load_image(str(path))
            else:
                lra_data._grey_pixels((str(path), path.read_bytes()))
        return
    if reader == "vit_data":
        grey = vit_data.load_image(str(path)).double().mean(0).numpy()  # (H, W)
    else:
        grey = lra_data._grey_pixels((str(path), path.read_bytes())).reshape(RAMP.shape).astype(np.float64)
    if mode == "1":
        assert grey.min() == 0 and grey.max() == 255 and (np.diff(grey, axis=1) >= 0).all()
    else:
        assert np.abs(grey - RAMP * 255).max() <= 3, np.abs(grey - RAMP * 255).max()


def replace_file(path, content):
    """What a preparation does to a file: a new one renamed over it (new inode and time)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(content)
    os.replace(tmp, path)


CHANGES = {  # what prepare_char.py --force can do to the data a run reads
    "meta.json": lambda p: replace_file(p, json.dumps(dict(json.loads(p.read_text()), chars="ABCDEFGHIJKLMNOPQRST"))
                                        .encode()),
    "train.bin": lambda p: replace_file(p, np.random.default_rng(1).integers(0, 20, 4000).astype(np.uint16).tobytes()),
    "val.bin": lambda p: replace_file(p, p.read_bytes()),  # the same bytes, another file
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_data_prepared_again_under_a_run_stops_it_with_the_checkpoint_whole(name, data, monkeypatch):
    """The first checkpoint (iter 2) is written, then the data is prepared again: the run stops
    at its next read of that file, in one line naming it and what is left."""
    real = td.read_batch

    def prepared_again_after_the_first_save(folder, split, *args):
        if os.path.exists("out/ckpt.pt") and not swapped:
            swapped.append(name)
            CHANGES[name](data / "data" / "tiny_char" / name)
        return real(folder, split, *args)

    swapped = []
    monkeypatch.setattr(td, "read_batch", prepared_again_after_the_first_save)
    code, message = call("train.py", *TINY, "--out_dir=out", "--max_iters=6", "--eval_interval=2")
    assert code == 1 and "\n" not in message, message
    assert f"data/tiny_char/{name} changed while this run was reading the data" in message
    assert "out/ckpt.pt holds iter 2; continue with the same command and --init_from=resume" in message
    assert checkpoints.load_checkpoint("out/ckpt.pt", "language")["iter_num"] == 2


# -----------------------------------------------------------------------------
# 5. evaluate.py: the score first, the record where --out says; package caches


def test_evaluate_prints_the_score_even_where_it_cannot_save_it(trained, capsys):
    (trained / "out" / "eval.jsonl").mkdir()  # a place that cannot take the record (as a read-only folder)
    code, message = call("evaluate.py", "--out_dir=out")
    out, err = capsys.readouterr()
    assert code == 0 and re.search(r"tiny_char val: loss \d+\.\d+, perplexity", out), out  # its own data
    (line,) = err.strip().splitlines()
    assert line.startswith("evaluate.py: warning: the result was not saved (Is a directory: ") and "--out=" in line
    assert_advice_exists(line)
    assert call("evaluate.py", "--out_dir=out", "--out=scores/eval.jsonl")[0] == 0  # where the user says
    record = json.loads((trained / "scores" / "eval.jsonl").read_text())
    assert record["dataset"] == "tiny_char" and record["split"] == "val" and record["tokens"] == 999


@pytest.mark.parametrize("argv,words", [
    (["--out=afile/eval.jsonl"], "cannot be written"), (["--out=out"], "is a folder"),
    (["--harness=lambada_openai", "--max_tokens=100"], "drop --max_tokens"),
    (["--harness=lambada_openai", "--dataset=tiny_char", "--split=val"], "drop --dataset, --split"),
    (["--harness_limit=5"], "--harness_limit limits the documents of --harness"),
])
def test_evaluate_refuses_what_it_would_ignore_or_lose_before_any_work(argv, words, trained):
    (trained / "afile").write_text("a file")
    refused("evaluate.py", "--out_dir=out", *argv, root=trained, contains=[words])


def cache_file(variable):
    return {"HF_HOME (or HF_DATASETS_CACHE)": os.path.expanduser("~/.cache/huggingface/datasets/x.lock"),
            "TIKTOKEN_CACHE_DIR": os.path.join(os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
                                               or os.path.join(tempfile.gettempdir(), "data-gym-cache"), "ab"),
            "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache/k")}[variable]


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.ENOTDIR])
@pytest.mark.parametrize("variable", ["HF_HOME (or HF_DATASETS_CACHE)", "TIKTOKEN_CACHE_DIR", "TRITON_CACHE_DIR"])
def test_a_package_cache_that_cannot_be_written_names_the_variable_that_moves_it(variable, code):
    line = cli.os_error_line(OSError(code, os.strerror(code), cache_file(variable)))
    assert f"set {variable} to a folder this process can write" in line
    assert "package" not in cli.os_error_line(OSError(code, os.strerror(code), "/srv/elsewhere/x"))


# -----------------------------------------------------------------------------
# 6. no default output is a tracked file

OUTPUT_KEYS = ("out_dir", "out", "out_json", "figure", "cache_dir", "data_dir")


def default_outputs(script):
    """Where a script writes when told nothing: its output settings' defaults (bench.py's "auto"
    resolved as it resolves it)."""
    settings, _ = DECLARED[script]
    paths = [settings[k] for k in OUTPUT_KEYS if isinstance(settings.get(k), str) and settings[k] not in ("", "auto")]
    if script == "bench.py":
        paths += ["bench_results.json"] + [bench_report.report_out(SimpleNamespace(out="auto", quick=quick), dict(
            slug="nvidia-h100-80gb-hbm3", gpu=gpu, plan=plan)) for quick in (True, False) for gpu in ("x", None)
            for plan in ("report", "headline")]
    return paths


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_default_output_is_a_file_the_repository_ships(script):
    for path in default_outputs(script):
        inside = path if os.path.splitext(path)[1] else os.path.join(path, "name", "train.bin")  # (a folder's files)
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", inside], cwd=REPO).returncode == 0
        tracked = subprocess.run(["git", "ls-files", "--", path], cwd=REPO, capture_output=True, text=True).stdout
        assert ignored and not tracked, (script, path, tracked)
    # vit_inspect and lra/summary write beside their input; render.py's output is the documents; export.py
    # writes only where --to says
    assert default_outputs(script) or script in ("vit_inspect.py", "lra/summary.py", "results/render.py", "export.py")


# -----------------------------------------------------------------------------
# 7. checkpoints of another version: one line in every reader


def nanogpt_checkpoint(path):
    """nanoGPT's layout: model, model_args, iter_num, best_val_loss, config; no kind, no tokenizer."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(dict(model={"transformer.wte.weight": torch.zeros(20, 16)}, optimizer={}, iter_num=100,
                    model_args=dict(n_layer=1, n_head=2, n_embd=16, block_size=16, bias=False, vocab_size=20,
                                    dropout=0.0), best_val_loss=1.5, config=dict(dataset="tiny_char")), path)


READERS = {  # script -> (its arguments, the kind of checkpoint it reads)
    "train.py": (TINY + ["--out_dir=old", "--init_from=resume"], "language"),
    "sample.py": (["--out_dir=old"], "language"),
    "evaluate.py": (["--out_dir=old"], "language"),
    "vit_train.py": (["--out_dir=old", "--init_from=resume", "--device=cpu"], "vit"),
    "vit_inspect.py": (["--ckpt=old"], "vit"),
    "lm_inspect.py": (["--out_dir=old"], "language"),
    "lra/train.py": (["--out_dir=old", "--eval_only=True", "--device=cpu"], "lra"),
}


@pytest.mark.parametrize("layout", ["nanogpt", "a bare tensor"])
@pytest.mark.parametrize("script", sorted(READERS))
def test_a_checkpoint_of_another_layout_is_one_line_saying_what_it_lacks(script, layout, data):
    """nanoGPT's layout, or torch.save of a bare tensor (issue 33: an AttributeError in sample.py)."""
    argv, kind = READERS[script]
    if layout == "a bare tensor":
        os.makedirs("old")
        torch.save(torch.zeros(3), "old/ckpt.pt")
        words = "old/ckpt.pt holds a Tensor, not a checkpoint (a dict of kind, model, model_args, config, iter_num)"
    else:
        nanogpt_checkpoint("old/ckpt.pt")
        missing = "kind, tokenizer" if kind == "language" else "kind"
        words = f"old/ckpt.pt was not written by this version of {checkpoints.KIND_MAKER[kind]} (it lacks {missing})"
    refused(script, *argv, root=data, contains=[words])


@pytest.mark.parametrize("script", ["train.py", "sample.py", "evaluate.py"])
def test_weights_of_another_version_are_one_line(script, trained):
    ckpt = checkpoints.load_checkpoint("out/ckpt.pt", "language")
    ckpt["model"] = {"_orig_mod." + k: v for k, v in ckpt["model"].items()}  # a compiled model's names
    torch.save(ckpt, "out/ckpt.pt")
    argv = ["--out_dir=out"] + (TINY + ["--init_from=resume", "--max_iters=8"] if script == "train.py" else [])
    refused(script, *argv, root=trained, contains=["out/ckpt.pt holds weights this version's GPT does not have",
                                                   "another version of nanoToST"])


def test_the_adapter_reads_old_checkpoints_in_one_line_too(data):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from nanotost import lm_eval_adapter

    nanogpt_checkpoint("old/ckpt.pt")
    with pytest.raises(cli.UserError, match=r"it lacks kind, tokenizer"):
        lm_eval_adapter.NanoToSTLM(out_dir="old", device="cpu")


# -----------------------------------------------------------------------------
# 8. what a resumed or long run says


def shapes_args():
    return ["--shapes_source_size=16", "--img_size=16", "--patch_size=8", "--n_layer=1", "--n_head=2", "--n_embd=16",
            "--shapes_num_classes=4", "--shapes_train_size=32", "--shapes_val_size=8", "--batch_size=8",
            "--device=cpu", "--dtype=float32", "--num_threads=1", "--log_interval=1", "--warmup_iters=0"]


def lra_args(root):
    folder = os.path.join(root, "listops")
    if not os.path.isdir(folder):
        lra_generate.write_listops(folder, n_train=32, n_val=8, n_test=8, seed=0, min_len=10, max_len=40,
                                   max_depth=3, max_args=4)
    return ["--n_layer=1", "--n_head=2", "--n_embd=16", "--mlp_hidden=32", "--batch_size=8", "--max_len=64",
            "--pad_multiple=8", "--log_interval=1", "--device=cpu", "--dtype=float32", "--num_threads=1",
            "--warmup_iters=0", f"--data_dir={folder}", "--cache_dir="]


TRAINERS = {"train.py": lambda root: TINY + ["--log_interval=1"], "vit_train.py": lambda root: shapes_args(),
            "lra/train.py": lra_args}


@pytest.mark.parametrize("init_from", ["scratch", "auto"])
@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_a_setting_the_run_never_reads_is_one_line_never_ignored(script, init_from, data, monkeypatch):
    """--finetune_from names the weights a finetune starts from; a new run from scratch (or auto,
    with nothing to resume) would train without them: one line, nothing written (the class's
    other members: bench.py's modes, tests/test_bench_settings.py; evaluate.py's --harness)."""
    message = refused(script, *TRAINERS[script](str(data)), "--out_dir=out", f"--init_from={init_from}",
                      "--finetune_from=elsewhere/ckpt.pt", "--max_iters=1", root=data, monkeypatch=monkeypatch)
    assert message == (f"{script}: --finetune_from: read by --init_from=finetune alone (a new run from its weights), "
                       f"not by --init_from={init_from}: add --init_from=finetune, or drop it")


@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_a_resumed_run_logs_each_iteration_once_and_says_the_command_that_continues(script, data, monkeypatch,
                                                                                    capsys):
    """Ctrl-C while the checkpoint of iter 4 is written (its evaluation already logged): the run
    says the same command continues it (init_from=auto), and it does; log.jsonl then holds each
    iteration's records once (those after iter 2, the checkpoint resumed from, were cut)."""
    argv = TRAINERS[script](str(data)) + ["--out_dir=out", "--eval_interval=2", "--max_iters=6", "--init_from=auto"]
    real = checkpoints.save_checkpoint

    def ctrl_c_while_iter_4_is_saved(obj, path, **kw):
        if obj["iter_num"] == 4:
            raise KeyboardInterrupt
        real(obj, path, **kw)

    monkeypatch.setattr(checkpoints, "save_checkpoint", ctrl_c_while_iter_4_is_saved)
    assert call(script, *argv)[0] == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"{script}: interrupted; out/ckpt.pt holds iter 2; continue with the same command", line
    monkeypatch.setattr(checkpoints, "save_checkpoint", real)
    assert call(script, *argv)[0] == 0
    with open("out/log.jsonl") as f:
        records = [json.loads(line) for line in f]
    keys = [(r["iter"], "val_loss" in r) for r in records]
    assert len(keys) == len(set(keys)), keys  # each iteration once
    assert {it for it, is_eval in keys if is_eval} == {0, 2, 4, 6} and keys == sorted(keys, key=lambda k: k[0])


def test_the_logger_keeps_what_came_before_the_checkpoint(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [{"iter": 0, "val_loss": 3}, {"iter": 0, "loss": 3}, {"iter": 1, "loss": 2}, {"iter": 2, "val_loss": 2},
             {"iter": 2, "loss": 2}, {"iter": 3, "loss": 1}, {"note": "no iteration"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"iter": 4, "lo')  # a line cut by a kill
    tk.JsonlLogger(str(path), resume_at=2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:4] + lines[-1:]


@pytest.mark.parametrize("argv", [["results/render.py", "--show=*"], ["train.py", "--help"]])
def test_output_into_a_reader_that_went_away_ends_quietly(argv):
    """`script | head`: once the reader has gone, a script stops as Unix tools do (status 141,
    nothing on stderr), not with a Broken pipe line or Python's 'Exception ignored' at exit."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the script writes (it takes ~1 s to start)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_long_generation_shows_progress_and_takes_its_workers_from_the_machine(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(devices, "cpu_cores", lambda: 3)
    monkeypatch.setattr(lra_generate, "write_pathfinder", lambda *args: seen.append(args[-1]) or "written")
    lra_generate.main(["--task=pathfinder", f"--out_dir={tmp_path}/a", "--n_images=10"])
    assert seen == [3]  # workers=0 (the default): one per core this process may use
    monkeypatch.undo()
    capsys.readouterr()

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    lra_generate.write_pathfinder(str(tmp_path / "b"), n_images=10, per_folder=5, workers=1)
    assert "pathfinder32 images" in terminal.getvalue() and "10/10" in terminal.getvalue()
    monkeypatch.undo()  # (issue 54, class 12: a bar where someone watches, nothing in a log or a pipe)
    lra_generate.write_pathfinder(str(tmp_path / "c"), n_images=10, per_folder=5, workers=1)
    assert "pathfinder32 images" not in capsys.readouterr().err


def test_bench_ratios_read_as_worded():
    rows = [dict(suite="op", impl=impl, mode="fwd", T=1024, ms=ms, note="") for impl, ms in
            (("torch", 3.0), ("cpu", 1.5), ("sdpa", 1.0))]
    rows += [dict(suite="model", impl=impl, mode="step", T=1024, ms=ms, peak_mb=mb, note="") for impl, ms, mb in
             (("cpu", 30.0, 50.0), ("sdpa", 10.0, 100.0))]
    text = "\n".join(bench_suites.summary(rows))
    assert "2.0x faster than torch" in text and "1.5x slower than SDPA" in text and "3.0x slower than GPT-2" in text
    assert not re.search(r"\b0\.\d+x (faster|slower)", text), text


def test_an_unreachable_hub_switches_its_libraries_offline_at_once(monkeypatch):
    import datasets
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "")  # (restored afterwards)
        monkeypatch.delenv(name)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE)

    def unreachable(address, timeout=None):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(devices.socket, "create_connection", unreachable)
    assert devices.hub_reachable() is False
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert datasets.config.HF_HUB_OFFLINE is True and huggingface_hub.constants.HF_HUB_OFFLINE is True
