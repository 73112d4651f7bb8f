"""
Issue 54: what a hostile user tried, class by class, each through the scripts as a user runs them
(in this process, under run_cli), with a checkpoint or an export made here:

  1. a writer follows a link only to what it recognises as its own (auto's cache, LRA's cache):
     a link planted in a cache folder never aims it at a file of the user's
  3. no reader records a non-finite figure as a result; export refuses weights its --dtype
     cannot hold (infinite once cast)
  5. $NANOTOST_CACHE and $NANOTOST_NO_C, given, are used or refused in one line, never passed over
  7. a resume of a checkpoint holding a field this version does not write is refused, the file
     left byte for byte; an earlier version's records resume
  8. a reader of an export writes beside the folder as resolved (--init_from=. included), and
     never inside it, whatever output path it is given
 11. what a dead run of a writer left (staging folders of this version or an earlier one, the
     report's temporary folder) goes; a live run's stays; an interrupted swap leaves nothing
 12. evaluate.py shows its progress on a terminal and nothing elsewhere; a reader of an export
     runs the threads the export records, else what the machine suggests

Classes 2 and 3 at load: tests/test_hub.py's BROKEN and tests/test_checkpoint_schema.py's
members; class 4: tests/test_bench_settings.py; 6: tests/test_speed_headline.py; 9:
tests/test_list_options.py; 10: tests/test_suite_ends.py and the order-of-events checks; 1's
manifests: tests/test_output_sets.py.

    python -m pytest -q tests/test_hostile.py
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import evaluate  # noqa: E402
import lm_inspect  # noqa: E402
import model  # noqa: E402
from kernels import auto_cache, cpu, fused  # noqa: E402
from nanotost import checkpoints, cli, devices, outputs, portable  # noqa: E402
from results.benchkit import report  # noqa: E402
from test_errors import TINY, call, refused, write_tiny_char  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny language run and its export: root/lm, root/model; root/data its dataset."""
    root = tmp_path_factory.mktemp("hostile")
    write_tiny_char(root, {"train": 3000, "val": 600})
    assert call("train.py", *TINY, f"--data_dir={root}/data", f"--out_dir={root}/lm", "--max_iters=2",
                "--eval_interval=2")[0] == 0
    assert call("export.py", f"--out_dir={root}/lm", f"--to={root}/model") == (0, "")
    return root


def dead_pid():
    """The pid of a process that has ended (a run killed -9 leaves names holding such a pid)."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


# -----------------------------------------------------------------------------
# 1. a link in a cache is followed only to the writer's own file


def users_file(tmp_path):
    path = tmp_path / "home" / "thesis.txt"
    path.parent.mkdir()
    path.write_text("the user's own words\n")
    return path


def nothing(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home" / "gone.txt"


def a_folder(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


LINKS = {"to a file of the user's": users_file, "to nothing (a dangling link)": nothing, "to a folder": a_folder}


@pytest.mark.parametrize("target", LINKS)
def test_a_link_in_auto_s_cache_is_replaced_never_written_through(target, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOTOST_CACHE", str(tmp_path / "cache"))
    key = auto_cache.key("cpu", ("causal_tssa", 4, 2, 64, 8, "float32", False), False, "inductor", "t")
    path = auto_cache.path_of(key)
    aim = LINKS[target](tmp_path)
    before = aim.read_bytes() if aim.is_file() else None
    os.symlink(aim, path)
    said = []
    assert auto_cache.read(path, key, say=said.append) is None  # (what is there is no pick: said, where there is one)
    auto_cache.write(path, key, {"triton": 1e-3, "reference": 2e-3}, "triton", (4, 2, 64, 8), say=said.append)
    assert not os.path.islink(path) and auto_cache.read(path, key) is not None  # the link itself replaced
    if before is not None:
        assert aim.read_bytes() == before  # the user's file as it was
    else:
        assert not aim.is_file() and os.listdir(tmp_path / "home") == []  # nothing made where it pointed


def test_a_link_to_a_pick_is_written_through_and_stays_a_link(tmp_path, monkeypatch):
    """What the writer recognises as its own (a pick) it writes through the user's link, as any writer does."""
    monkeypatch.setenv("NANOTOST_CACHE", str(tmp_path / "cache"))
    key = auto_cache.key("cpu", ("tssa", 1, 2, 64, 8, "float32", False), False, "inductor", "t")
    path = auto_cache.path_of(key)
    elsewhere = tmp_path / "picks" / "mine.json"
    elsewhere.parent.mkdir()
    auto_cache.write(str(elsewhere), key, {"triton": 3e-3, "reference": 2e-3}, "reference", (1, 2, 64, 8))
    os.symlink(elsewhere, path)
    auto_cache.write(path, key, {"triton": 1e-3, "reference": 2e-3}, "triton", (1, 2, 64, 8))
    assert os.path.islink(path) and auto_cache.read(str(elsewhere), key)["pick"] == "triton"


def test_a_link_in_lra_s_cache_is_replaced_never_written_through(tmp_path):
    from lra import data

    split = data.Split((data.Ragged(np.arange(6, dtype=np.int64), np.array([0, 2, 6]), 0),), np.array([0, 1]),
                       np.array([False, False]))
    thesis = users_file(tmp_path)
    link = tmp_path / "cache.npz"
    os.symlink(thesis, link)
    data._write_cache(str(link), split)
    assert thesis.read_text() == "the user's own words\n" and not os.path.islink(link)
    assert data._read_cache(str(link), print).labels.tolist() == [0, 1]


@pytest.mark.parametrize("log, own", [('{"iter": 0, "val_loss": 3.0}\n{"iter": 1, "tr', True),
                                      ("my notes, in a file of that name\n", False), ("", False),
                                      ('{"iter": 0}\n[1, 2]\n', False)])
def test_a_scratch_run_replaces_a_log_only_where_it_is_a_runs(log, own, made, tmp_path, monkeypatch):
    """train.py starts out_dir/log.jsonl afresh: an earlier run's (cut short by a kill too) goes; a
    file of the user's of that name is one line, left as it was."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("run")
    (tmp_path / "run" / "log.jsonl").write_text(log)
    argv = TINY + [f"--data_dir={made}/data", "--out_dir=run", "--max_iters=1", "--eval_interval=1"]
    if own:
        assert call("train.py", *argv)[0] == 0
        assert all(json.loads(line)["iter"] <= 1 for line in open("run/log.jsonl"))
    else:
        refused("train.py", *argv, root=tmp_path, contains=["run/log.jsonl is not a log a run wrote"])
        assert (tmp_path / "run" / "log.jsonl").read_text() == log


# -----------------------------------------------------------------------------
# 3. no reader records a figure that is no number; export refuses weights its dtype cannot hold


def test_a_score_that_is_nan_is_not_recorded(made, tmp_path, monkeypatch):
    forward = model.GPT.forward

    def broken(self, idx, targets=None, **kwargs):  # (as float16 overflow, or a fork's bug, would make it)
        logits, loss = forward(self, idx, targets, **kwargs)
        return logits, None if loss is None else loss * float("nan")
    monkeypatch.setattr(model.GPT, "forward", broken)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(made / "lm", tmp_path / "lm")
    message = refused("evaluate.py", "--out_dir=lm", f"--data_dir={made}/data", "--max_tokens=64", root=tmp_path,
                      contains=["the score: loss is NaN, not a finite number, so nothing was recorded"])
    assert "--dtype=float32" in message and not os.path.exists(tmp_path / "lm" / "eval.jsonl")


def test_an_inspection_with_a_nan_figure_is_not_recorded(made, tmp_path, monkeypatch):
    def nan_after(model, layer_maps):  # (R_var after a step: NaN, as a broken fork's maths would give)
        n = len(layer_maps[0]["pi"])
        return torch.ones(n, 1), torch.full((n, 1), float("nan"))
    monkeypatch.setattr(lm_inspect, "rvar_before_after", nan_after)
    monkeypatch.chdir(tmp_path)
    refused("lm_inspect.py", f"--out_dir={made}/lm", f"--data_dir={made}/data", "--n_windows=2",
            f"--page_dir={tmp_path / 'page'}", root=tmp_path,
            contains=["the inspection: rvar.train.after[0] is NaN, not a finite number, so nothing was recorded"])


def test_export_refuses_weights_its_dtype_cannot_hold_and_non_finite_ones(made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoints.read(str(made / "lm" / "ckpt.pt"))
    os.makedirs("big")
    torch.save(dict(ckpt, model={k: v * 1e6 if k == "ln_f.weight" else v for k, v in ckpt["model"].items()}),
               "big/ckpt.pt")
    refused("export.py", "--out_dir=big", "--to=out", "--dtype=float16", root=tmp_path,
            contains=["ln_f.weight holds", "that float16 cannot hold (infinite once cast)", "--dtype"])
    assert call("export.py", "--out_dir=big", "--to=out", "--dtype=bfloat16")[0] == 0  # (bfloat16 holds them)
    os.makedirs("nan")
    torch.save(dict(ckpt, model={k: v * float("nan") if k == "ln_f.weight" else v for k, v in ckpt["model"].items()}),
               "nan/ckpt.pt")
    refused("export.py", "--out_dir=nan", "--to=out2", root=tmp_path,
            contains=["NaN or infinite values in ln_f.weight"])


# -----------------------------------------------------------------------------
# 5. a setting the user gave is used, or refused in one line


def fresh_kernels(monkeypatch):
    """The C kernels not loaded yet in this process (as in a new one)."""
    monkeypatch.setattr(cpu, "_c_lib_cache", [])
    monkeypatch.setattr(fused, "_OPS", {})


CACHES = {"a file": lambda tmp: (tmp / "f").write_text("x") and tmp / "f",
          "under a file": lambda tmp: (tmp / "f").write_text("x") and tmp / "f" / "cache",
          "a folder this process cannot write": lambda tmp: tmp}


@pytest.mark.parametrize("case", CACHES)
def test_a_nanotost_cache_that_cannot_be_the_cache_is_one_line(case, made, tmp_path, monkeypatch):
    """sample.py with the C kernels (which build into the cache) and auto's cache: refused, not
    passed over for the temp folder."""
    given = CACHES[case](tmp_path)
    if case == "a folder this process cannot write":
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(given) else real(p, mode, **k))
    monkeypatch.setenv("NANOTOST_CACHE", str(given))
    fresh_kernels(monkeypatch)
    monkeypatch.chdir(tmp_path)
    refused("sample.py", f"--out_dir={made}/lm", "--tssa_impl=cpu", "--max_new_tokens=2", "--num_samples=1",
            root=tmp_path, contains=[f"NANOTOST_CACHE={str(given)!r}", "set it to a folder"])
    with pytest.raises(cli.ConfigError, match="NANOTOST_CACHE="):
        auto_cache.folder()


def test_nanotost_no_c_of_another_value_is_one_line(made, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOTOST_NO_C", "yes")
    fresh_kernels(monkeypatch)
    monkeypatch.chdir(tmp_path)
    refused("sample.py", f"--out_dir={made}/lm", "--tssa_impl=cpu", "--max_new_tokens=2", root=tmp_path,
            contains=["NANOTOST_NO_C must be 1 (no C kernels) or 0, got 'yes'"])


@pytest.mark.parametrize("script", ["sample.py", "evaluate.py", "train.py"])
def test_float16_asked_for_on_the_cpu_is_one_line_not_bfloat16(script, made, tmp_path, monkeypatch):
    """It ran as bfloat16 without a word: a setting given is used or refused."""
    monkeypatch.chdir(tmp_path)
    argv = {"sample.py": [f"--out_dir={made}/lm", "--start=abc"],
            "evaluate.py": [f"--out_dir={made}/lm", f"--data_dir={made}/data"],
            "train.py": TINY[:-3] + ["--out_dir=new", f"--data_dir={made}/data"]}[script]
    refused(script, *argv, "--device=cpu", "--dtype=float16", root=tmp_path,
            contains=["dtype=float16 does not run on the CPU", "--dtype=bfloat16"])


# -----------------------------------------------------------------------------
# 7. a resume refuses what its next save would drop, and leaves the file as it was


def test_a_resume_of_a_checkpoint_with_a_field_this_version_does_not_write_leaves_it_byte_for_byte(made, tmp_path,
                                                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoints.read(str(made / "lm" / "ckpt.pt"))
    os.makedirs("run")
    torch.save(dict(ckpt, ema={k: v.clone() for k, v in ckpt["model"].items()}), "run/ckpt.pt")
    whole = open("run/ckpt.pt", "rb").read()
    argv = TINY + [f"--data_dir={made}/data", "--out_dir=run", "--init_from=resume", "--max_iters=4"]
    refused("train.py", *argv, root=tmp_path, contains=["run/ckpt.pt holds ema, which this version of train.py does "
                                                       "not write", "--init_from=finetune"])
    assert open("run/ckpt.pt", "rb").read() == whole
    assert call("sample.py", "--out_dir=run", "--start=abc", "--max_new_tokens=2")[0] == 0  # (a reader: not asked)
    torch.save(dict(ckpt, world_size=1, data={"seed": 1337, "iter": 2}), "run/ckpt.pt")  # an earlier version's records
    assert call("train.py", *argv)[0] == 0
    assert checkpoints.read("run/ckpt.pt")["iter_num"] == 4


# -----------------------------------------------------------------------------
# 8. outputs from the folder as resolved, never inside the model's folder


def test_init_from_dot_in_the_models_folder_writes_beside_it(made, tmp_path, monkeypatch):
    shutil.copytree(made / "model", tmp_path / "model")
    before = {n: (tmp_path / "model" / n).read_bytes() for n in os.listdir(tmp_path / "model")}
    monkeypatch.chdir(tmp_path / "model")
    data = f"--data_dir={made}/data"
    assert call("evaluate.py", "--init_from=.", data, "--max_tokens=64")[0] == 0
    assert call("lm_inspect.py", "--init_from=.", data, "--n_windows=2")[0] == 0
    assert call("evaluate.py", "--init_from=./", data, "--max_tokens=64")[0] == 0
    assert {n: (tmp_path / "model" / n).read_bytes() for n in os.listdir(tmp_path / "model")} == before
    assert sorted(os.listdir(tmp_path)) == ["model", "model-eval.jsonl", "model-inspect"]
    assert len(open(tmp_path / "model-eval.jsonl").readlines()) == 2


@pytest.mark.parametrize("script, argv", [
    ("evaluate.py", ["--out=model/eval.jsonl"]), ("evaluate.py", ["--out=model/sub/x.jsonl"]),
    ("lm_inspect.py", ["--page_dir=model/inspect"]), ("lm_inspect.py", ["--page_dir=model"]),
    ("evaluate.py", ["--out=link/eval.jsonl"])])
def test_no_reader_writes_inside_the_models_folder_whatever_path_it_is_given(script, argv, made, tmp_path,
                                                                             monkeypatch):
    shutil.copytree(made / "model", tmp_path / "model")
    os.symlink(tmp_path / "model", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    refused(script, "--init_from=model", f"--data_dir={made}/data", *argv, root=tmp_path,
            contains=["lies inside the model's folder model, which is shared as it was exported", "model-"])


# -----------------------------------------------------------------------------
# 11. what a writer's dead runs left goes, and nothing else


def test_what_dead_runs_of_any_version_left_beside_a_set_goes_and_a_live_ones_stays(made, tmp_path, monkeypatch):
    """lm_inspect.py over a page folder beside staging folders: a dead run's of this version
    (.p.tmp<pid>) or of issue 40's (.p.new<pid>) goes; a live process's stays, and so does the user's."""
    monkeypatch.chdir(tmp_path)
    dead, alive = dead_pid(), os.getppid()
    left = [f".p.tmp{dead}", f".p.new{dead}"]
    kept = [f".p.new{alive}", ".p.new", "p.new1"]
    for name in left + kept:
        os.makedirs(tmp_path / name)
        (tmp_path / name / "index.html").write_text("half a page")
    assert call("lm_inspect.py", f"--out_dir={made}/lm", f"--data_dir={made}/data", "--n_windows=2",
                "--page_dir=p")[0] == 0
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["p"])


def test_an_interrupt_during_the_swap_leaves_no_staging_behind(made, tmp_path, monkeypatch, capsys):
    """prepare_char.py --force, Ctrl-C arriving during its swap: the swap ends, the earlier data
    set aside goes too, then the interrupt (exit 130): beside the data, the data alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.txt").write_text("A book of a few words, and more words.\n" * 20)
    argv = ["--input=book.txt", "--name=book"]
    assert call("prepare_char.py", *argv)[0] == 0
    (tmp_path / "book.txt").write_text("Another book, with other words.\n" * 20)
    swap = outputs.swap_folders

    def interrupted(*folders):
        signal.raise_signal(signal.SIGINT)  # (held: delivered once the swap is done)
        swap(*folders)
    monkeypatch.setattr(outputs, "swap_folders", interrupted)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # (as from a terminal, whatever pytest got)
    try:
        code, message = call("prepare_char.py", *argv, "--force")
    finally:
        signal.signal(signal.SIGINT, old)
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert os.listdir(tmp_path / "data") == ["book"]
    assert "h" in json.loads((tmp_path / "data" / "book" / "meta.json").read_text())["chars"]  # the new book's data
    assert sorted(os.listdir(tmp_path / "data" / "book")) == [outputs.MANIFEST, "meta.json", "train.bin", "val.bin"]


def test_the_reports_temporary_folder_of_a_dead_run_goes(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = tmp_path / f"{report.TEMP_PREFIX}{dead_pid()}"
    live = tmp_path / f"{report.TEMP_PREFIX}{os.getppid()}"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "part.json").write_text("{}")
    mine = report.report_temp()
    assert mine == str(tmp_path / f"{report.TEMP_PREFIX}{os.getpid()}") and os.path.isdir(mine)
    assert not dead.exists() and live.exists()
    shutil.rmtree(mine)


# -----------------------------------------------------------------------------
# 12. progress where someone watches; the threads the export or the machine suggests


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_evaluate_shows_its_progress_on_a_terminal_alone(terminal, made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(made / "lm", tmp_path / "lm")
    err = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    evaluate.main(["--out_dir=lm", f"--data_dir={made}/data", "--batch_size=2"])
    shown = err.getvalue()
    assert ("tiny_char val:" in shown and "batch" in shown) == terminal, shown[-300:]
    if not terminal:
        assert shown == ""


def test_a_reader_of_an_export_runs_the_threads_it_records_else_the_machines_free_cores(made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(made / "model", tmp_path / "model")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert call("sample.py", "--init_from=model", "--start=abc", "--max_new_tokens=2")[0] == 0
        recorded = json.loads((tmp_path / "model" / "config.json").read_text())["training"]["num_threads"]
        assert recorded == 1 and torch.get_num_threads() == 1  # (the run's own: TINY's --num_threads=1)
        config = json.loads((tmp_path / "model" / "config.json").read_text())
        config["training"].pop("num_threads")  # (an export written before it was recorded)
        (tmp_path / "model" / "config.json").write_text(json.dumps(config))
        monkeypatch.setattr(portable, "load_average", lambda: (devices.cpu_cores() - 1.0, 0.0, 0.0))
        torch.set_num_threads(max(2, devices.cpu_cores()))
        assert call("sample.py", "--init_from=model", "--start=abc", "--max_new_tokens=2")[0] == 0
        assert torch.get_num_threads() == 1  # all cores but one busy: one thread
        assert call("sample.py", "--init_from=model", "--start=abc", "--max_new_tokens=2", "--num_threads=2")[0] == 0
        assert torch.get_num_threads() == 2  # (the reader's own setting first)
    finally:
        torch.set_num_threads(threads)
