"""
Issue 39: a checkpoint from anyone is data, never code. Every reader goes through
trainkit.load_checkpoint, which loads with torch.load(weights_only=True) (checkpoints.read), and
the trainers write nothing else (checkpoints.not_plain).

  1. a ckpt.pt whose pickle calls a function (os.system) or builds a class: refused in one line
     that names the file, by every reader the way a user runs it, and the command never runs
     (its marker file is not there afterwards)
  2. every checkpoint the three trainers write loads under weights_only=True alone (no
     stand-ins), with and without its optimizer state; the RNG states come back exactly
  3. a checkpoint of the previous version (numpy's RNG state an array) still loads and resumes,
     numpy's RNG afresh, without numpy being run; an array anywhere else is refused
  4. what is not plain data is never written: a value in a checkpoint, a setting of a config file

In this process through cli.run_cli, refused before any work; one tiny run per trainer (seconds).

    python -m pytest -q tests/test_checkpoint_data.py
"""

import json
import os
import random
import shlex
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanotost import checkpoints, cli
from nanotost import trainkit as tk  # noqa: E402
from test_error_classes import lra_args, shapes_args  # noqa: E402
from test_errors import TINY, call, refused, write_tiny_char  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A checkpoint written by each trainer (2 iterations, tiny): kind -> its ckpt.pt; and the
    root, whose data/tiny_char is the language run's dataset."""
    root = tmp_path_factory.mktemp("written")
    write_tiny_char(root, {"train": 2000, "val": 500})
    trainers = {"language": ("train.py", TINY + [f"--data_dir={root}/data"]), "vit": ("vit_train.py", shapes_args()),
                "lra": ("lra/train.py", lra_args(str(root)))}
    paths = {"root": root}
    for kind, (script, argv) in trainers.items():
        out = root / kind
        assert call(script, *argv, f"--out_dir={out}", "--max_iters=2", "--eval_interval=2")[0] == 0
        paths[kind] = str(out / "ckpt.pt")
    return paths


# -----------------------------------------------------------------------------
# 1. a checkpoint that would run code


class RunsCommand:
    """Pickled as a call of os.system: what a malicious ckpt.pt holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


class Gadget:
    """An object of a class: torch.load(weights_only=False) would build it, running __setstate__."""

    def __init__(self, marker):
        self.marker = marker

    def __setstate__(self, state):
        open(state["marker"], "w").close()


def malicious(written, kind, folder, payload=RunsCommand):
    """A real checkpoint of `kind` with its RNG states replaced by the payload, at folder/ckpt.pt;
    returns (that path, the marker the payload would create)."""
    marker = os.path.join(os.path.dirname(os.path.abspath(folder)), "MARKER")
    ckpt = checkpoints.load_checkpoint(written[kind], kind)
    os.makedirs(folder)
    torch.save(dict(ckpt, rng=[payload(marker)]), os.path.join(folder, "ckpt.pt"))
    return os.path.join(folder, "ckpt.pt"), marker


READERS = {  # how a user reads a checkpoint at evil/ckpt.pt -> (the script, its arguments, the kind)
    "train.py --init_from=resume": ("train.py", TINY + ["--out_dir=evil", "--init_from=resume"], "language"),
    "sample.py": ("sample.py", ["--out_dir=evil", "--max_new_tokens=2"], "language"),
    "evaluate.py": ("evaluate.py", ["--out_dir=evil"], "language"),
    "lm_inspect.py": ("lm_inspect.py", ["--out_dir=evil"], "language"),
    "vit_inspect.py": ("vit_inspect.py", ["--ckpt=evil/ckpt.pt"], "vit"),
    "vit_train.py --init_from=resume": ("vit_train.py", ["--out_dir=evil", "--init_from=resume", "--device=cpu"],
                                        "vit"),
    "vit_train.py --init_from=finetune": ("vit_train.py", ["--init_from=finetune", "--finetune_from=evil/ckpt.pt",
                                                           "--out_dir=tuned", "--device=cpu"], "vit"),
    "lra/train.py --init_from=resume": ("lra/train.py", ["--out_dir=evil", "--init_from=resume", "--device=cpu"],
                                        "lra"),
    "lra/train.py --eval_only": ("lra/train.py", ["--out_dir=evil", "--eval_only=True", "--device=cpu"], "lra"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_checkpoint_that_calls_a_function_is_refused_by_every_script_and_nothing_runs(reader, written, tmp_path,
                                                                                         monkeypatch):
    script, argv, kind = READERS[reader]
    monkeypatch.chdir(tmp_path)
    path, marker = malicious(written, kind, "evil")
    refused(script, *argv, root=tmp_path, monkeypatch=monkeypatch,
            contains=[f"{path} holds code or objects", "(GLOBAL posix.system)", "nothing in it was run",
                      checkpoints.KIND_MAKER[kind]])
    assert not os.path.exists(marker)


def test_an_object_of_a_class_is_refused_too_and_its_code_never_runs(written, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, marker = malicious(written, "language", "evil", Gadget)
    refused("sample.py", "--out_dir=evil", root=tmp_path, monkeypatch=monkeypatch,
            contains=[f"{path} holds code or objects", f"GLOBAL {Gadget.__module__}.Gadget", "nothing in it was run"])
    assert not os.path.exists(marker)


def fake_lra_run(source):
    """subprocess.run for lra/listops_runs.one_run: the run 'writes' its log and the checkpoint at source."""
    def run(command, **kw):
        out = next(a for a in command if a.startswith("--out_dir="))[len("--out_dir="):]
        os.makedirs(out)
        with open(os.path.join(out, "log.jsonl"), "w") as f:
            f.write(json.dumps(dict(iter=2, val_acc=0.5, best_val_acc=0.5, test_acc_at_best_val=0.5)) + "\n")
        shutil.copy(source, os.path.join(out, "ckpt.pt"))
        return SimpleNamespace(returncode=0, stdout="", stderr="")
    return run


@pytest.mark.parametrize("reader", ["lm-eval adapter", "results/compare/pydocs.py", "lra/listops_runs.py"])
def test_the_library_readers_refuse_it_in_one_line_too(reader, written, tmp_path, monkeypatch):
    """The lm-eval adapter (lm_harness.py, evaluate.py --harness), results/compare/'s and lra/'s result readers."""
    kind = "lra" if reader.startswith("lra") else "language"
    path, marker = malicious(written, kind, str(tmp_path / "evil"))
    with pytest.raises(cli.UserError) as refusal:
        if reader == "lm-eval adapter":
            pytest.importorskip("lm_eval", reason="lm-eval is not installed")
            from nanotost import lm_eval_adapter
            lm_eval_adapter.NanoToSTLM(out_dir=os.path.dirname(path), device="cpu")
        elif reader == "results/compare/pydocs.py":
            from results.compare import pydocs
            pydocs.step_seconds(os.path.dirname(path))
        else:
            from lra import listops_runs
            monkeypatch.setattr(listops_runs.subprocess, "run", fake_lra_run(path))
            listops_runs.one_run("shared_tssa", "config.py", [], 1, "native", SimpleNamespace(max_iters=0,
                                                                                             data_dir="data"))
    message = str(refusal.value)
    assert "\n" not in message and "holds code or objects" in message and "(GLOBAL posix.system)" in message
    assert not os.path.exists(marker)


# -----------------------------------------------------------------------------
# 2. what the trainers write


@pytest.mark.parametrize("kind", ["language", "vit", "lra"])
def test_every_checkpoint_a_trainer_writes_loads_as_plain_data(kind, written, tmp_path):
    """torch.load(weights_only=True) alone, no stand-in for anything: the whole checkpoint, and the
    same without its optimizer state (weights shared alone)."""
    ckpt = torch.load(written[kind], map_location="cpu", weights_only=True)
    assert checkpoints.not_plain(ckpt) is None
    assert ckpt["iter_num"] == 2 and ckpt["kind"] == kind
    moments = [s["exp_avg"] for s in ckpt["optimizer"]["state"].values()]
    assert moments and all(m.abs().sum() > 0 for m in moments)  # the optimizer's state, after 2 steps
    assert isinstance(ckpt["rng"][0]["numpy"], list) and len(ckpt["rng"][0]["numpy"][1]) == 624
    ckpt.pop("optimizer")
    checkpoints.save_checkpoint(ckpt, str(tmp_path / "ckpt.pt"))
    alone = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    assert all(torch.equal(alone["model"][k], v) for k, v in ckpt["model"].items())


def test_the_rng_states_come_back_exactly_from_a_checkpoint(written, tmp_path):
    """python's, numpy's (its cached Gaussian too) and torch's, through a file and back."""
    d = SimpleNamespace(ddp=False, world_size=1, rank=0)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # numpy now holds a second Gaussian for the next call
    path = str(tmp_path / "ckpt.pt")
    checkpoints.save_checkpoint(dict(checkpoints.load_checkpoint(written["lra"], "lra"), rng=tk.gather_rng_states(d)), path)

    def draws():
        return random.random(), np.random.normal(), np.random.random(3).tolist(), torch.rand(3).tolist()
    expected = draws()
    tk.restore_rng(tk.load_checkpoint(path, "lra", "resume")["rng"], d, say=print)
    assert draws() == expected  # exactly


# -----------------------------------------------------------------------------
# 3. a checkpoint of the previous version


def test_a_checkpoint_of_the_previous_version_resumes_with_numpy_afresh(written, tmp_path, monkeypatch, capsys):
    """Before issue 39 numpy's RNG state was np.random.get_state(), an array: read without numpy,
    it is the one thing lost (said in one line); the weights, optimizer and other RNGs come back."""
    monkeypatch.chdir(tmp_path)
    ckpt = checkpoints.load_checkpoint(written["language"], "language")
    os.makedirs("old")
    old_rng = [dict(state, numpy=np.random.get_state()) for state in ckpt["rng"]]
    torch.save(dict(ckpt, rng=old_rng), "old/ckpt.pt")
    assert checkpoints.load_checkpoint("old/ckpt.pt", "language")["rng"][0]["numpy"] is None
    argv = TINY + [f"--data_dir={written['root']}/data", "--out_dir=old", "--init_from=resume", "--max_iters=4",
                   "--eval_interval=2"]
    assert call("train.py", *argv)[0] == 0
    out = capsys.readouterr().out
    assert "numpy's RNG starts afresh" in out and "resumed from old/ckpt.pt at iter 2" in out
    assert checkpoints.load_checkpoint("old/ckpt.pt", "language")["iter_num"] == 4  # written as plain data now
    torch.save(dict(ckpt, config=dict(ckpt["config"], learning_rate=np.zeros(1))), "old/ckpt.pt")
    refused("sample.py", "--out_dir=old", root=tmp_path,
            contains=["old/ckpt.pt holds code or objects", "a numpy array at checkpoint['config']['learning_rate']"])


# -----------------------------------------------------------------------------
# 4. nothing but plain data is written


def test_a_value_that_is_not_plain_data_is_never_written(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    with pytest.raises(cli.UserError, match=r"ckpt.pt was not written: a numpy.float64 at checkpoint\['config'\]"
                                            r"\['lr'\], and a checkpoint holds plain data alone"):
        checkpoints.save_checkpoint(dict(kind="lra", model={}, config={"lr": np.float64(0.1)}), path)
    assert os.listdir(tmp_path) == []


def test_a_config_file_setting_a_numpy_number_in_a_tuple_is_refused_before_any_work(tmp_path, monkeypatch):
    """A config file is Python: it may build anything, but what a checkpoint keeps is plain."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "crop.py").write_text("import numpy as np\ncrop_scale = (np.float64(0.5), 1.0)\n")
    refused("vit_train.py", "crop.py", "--device=cpu", root=tmp_path,
            contains=["crop_scale expects a tuple of numbers or strings"])
