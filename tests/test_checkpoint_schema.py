"""
Issue 47, classes 1-3: what a checkpoint holds is checked before any reader uses it, in the one
loader (trainkit.load_checkpoint -> checkpoints.check), the same way for every reader.

  1. every field's type and range (model_args by the model's own rules: its config's field
     types, MODEL_RANGES, __post_init__, the weights it describes), the fields each use needs and
     only those (a checkpoint shared without its optimizer scores, samples and fine-tunes; a
     resume refuses it and says how to start a new run from its weights), floating weights
  2. the model arguments: an unknown attention, Pi or field is one line everywhere, resumes and
     --eval_only included, and never dropped
  3. a file of another format is named for what it is, with what to do with it

Each member: a real checkpoint of each trainer (test_checkpoint_data's `written`), changed, given
to the scripts the way a user runs them (in this process): exit 1, one line naming the file and
the field, no traceback, nothing written.

    python -m pytest -q tests/test_checkpoint_schema.py
"""

import copy
import functools
import gzip
import json
import os
import pickle
import sys
import zipfile

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanotost import checkpoints, cli
from nanotost import trainkit as tk  # noqa: E402
from helpers_advice import assert_advice_exists  # noqa: E402
from test_checkpoint_data import written  # noqa: E402,F401 (the fixture: a checkpoint of each trainer)
from test_error_classes import lra_args, shapes_args  # noqa: E402
from test_errors import TINY, call, listing  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine
KINDS = ("language", "vit", "lra")
CONFIG = {"language": "GPTConfig", "vit": "ViTConfig", "lra": "LRAConfig"}
MODEL = {"language": "GPT", "vit": "ToSTViT", "lra": "LRAClassifier"}


READERS = {  # how a user reads the checkpoint in folder RUN: name -> (kind, use, script)
    "sample.py": ("language", "weights", "sample.py"),
    "evaluate.py": ("language", "weights", "evaluate.py"),
    "lm_inspect.py": ("language", "weights", "lm_inspect.py"),
    "lm-eval adapter": ("language", "weights", None),
    "train.py resume": ("language", "resume", "train.py"),
    "train.py finetune": ("language", "weights", "train.py"),
    "vit_inspect.py": ("vit", "weights", "vit_inspect.py"),
    "vit_train.py resume": ("vit", "resume", "vit_train.py"),
    "vit_train.py finetune": ("vit", "weights", "vit_train.py"),
    "lra/train.py resume": ("lra", "resume", "lra/train.py"),
    "lra/train.py --eval_only": ("lra", "weights", "lra/train.py"),
    "lra/train.py finetune": ("lra", "weights", "lra/train.py"),
}
TRAINERS = [r for r in READERS if r.split()[0] in ("train.py", "vit_train.py", "lra/train.py")]
NAMES = sorted(READERS)


def arguments(reader, written):
    """The reader's arguments (RUN: the folder of the checkpoint, NEW: a new folder), its data the
    fixture's."""
    data, lra = f"--data_dir={written['root']}/data", lra_args(str(written["root"]))
    finetune = ["--out_dir=NEW", "--init_from=finetune", "--finetune_from=RUN/ckpt.pt"]
    return {
        "sample.py": ["--out_dir=RUN", "--max_new_tokens=2"],
        "evaluate.py": ["--out_dir=RUN", data, "--max_tokens=64"],
        "lm_inspect.py": ["--out_dir=RUN", data],
        "lm-eval adapter": [],
        "train.py resume": TINY + [data, "--out_dir=RUN", "--init_from=resume"],
        "train.py finetune": TINY + [data] + finetune,
        "vit_inspect.py": ["--ckpt=RUN/ckpt.pt", "--out_dir=NEW"],
        "vit_train.py resume": shapes_args() + ["--out_dir=RUN", "--init_from=resume"],
        "vit_train.py finetune": shapes_args() + finetune,
        "lra/train.py resume": lra + ["--out_dir=RUN", "--init_from=resume"],
        "lra/train.py --eval_only": lra + ["--out_dir=RUN", "--eval_only=True"],
        "lra/train.py finetune": lra + finetune,
    }[reader]


@functools.lru_cache(maxsize=None)
def read_once(path):
    return checkpoints.read(path)


def changed(written, kind, folder, change):
    """The checkpoint `kind`'s trainer wrote, change(ckpt, kind) applied, at folder/ckpt.pt (torch.save
    as anyone may write it). Returns that path."""
    ckpt = copy.deepcopy(read_once(written[kind]))
    change(ckpt, kind)
    os.makedirs(folder)
    path = os.path.join(folder, "ckpt.pt")
    torch.save(ckpt, path)
    return path


def refused_by(reader, written, root, monkeypatch, contains):
    """The reader refuses the checkpoint in root/run the one way: exit 1, one line starting with the
    script's name and naming what `contains` says, no traceback, its advice real, nothing written
    under root. Returns the message."""
    run, script = str(root / "run"), READERS[reader][2]
    argv = [a.replace("RUN", run).replace("NEW", str(root / "new")) for a in arguments(reader, written)]
    monkeypatch.chdir(root)
    before = listing(root)
    if script is None:  # the lm-eval adapter: a library, its refusal a UserError
        pytest.importorskip("lm_eval", reason="lm-eval is not installed")
        from nanotost import lm_eval_adapter
        with pytest.raises(cli.UserError) as refusal:
            lm_eval_adapter.NanoToSTLM(out_dir=run, device="cpu")
        message = str(refusal.value)
    else:
        code, message = call(script, *argv, monkeypatch=monkeypatch)
        assert code == 1, (code, message)
        assert message.startswith(script + ": "), message
    assert message.count("\n") == 0 and "Traceback" not in message, message
    for text in contains:
        assert text in message, message
    assert_advice_exists(message, script)
    assert listing(root) == before, "a refusal wrote something"
    return message


def setting(kind, language, vit, lra):
    return {"language": language, "vit": vit, "lra": lra}[kind]


def args_of(**values):
    """A change: these model_args (None: the field removed)."""
    def change(ckpt, kind):
        for key, value in values.items():
            ckpt["model_args"][key] = value
    return change


def field(name, value):
    """A change: the field set to value (a function of the checkpoint and kind), or removed (None)."""
    def change(ckpt, kind):
        if value is None:
            ckpt.pop(name)
        else:
            ckpt[name] = value(ckpt, kind)
    return change


def first_float(m):
    """The name of the first floating weight of a model's weights."""
    return next(k for k, v in m.items() if v.is_floating_point())


def weights(edit):
    def change(ckpt, kind):
        ckpt["model"] = edit(dict(ckpt["model"]))
    return change


# -----------------------------------------------------------------------------
# 1. what each field holds, for the uses that need it

# member -> (the change, the words of the refusal: text, or a function of the kind)
FIELD_MEMBERS = {
    "n_layer as text": (args_of(n_layer="1"), lambda k: f"model_args n_layer = '1' (str), where {CONFIG[k]} takes int"),
    "attn as a list": (args_of(attn=["tssa"]), lambda k: f"attn = ['tssa'] (list), where {CONFIG[k]} takes str"),
    "n_head as a bool": (args_of(n_head=True), lambda k: f"n_head = True (bool), where {CONFIG[k]} takes int"),
    "n_embd negative": (args_of(n_embd=-32), "holds model_args this version refuses (n_embd must be at least 1, got -"),
    "a length below 1": (lambda c, k: c["model_args"].update({setting(k, "block_size", "img_size", "max_len"): -1}),
                         lambda k: f"{setting(k, 'block_size', 'img_size', 'max_len')} must be at least 1, got -1"),
    "dropout above 1": (args_of(dropout=1.5), "dropout must be in [0, 1), got 1.5"),
    "a NaN": (args_of(ln_eps=float("nan")), "model_args ln_eps = nan (float)"),
    "a million layers": (args_of(n_layer=10**6), "too few for the model_args' n_layer=1000000"),
    "a layer the weights lack": (args_of(n_layer=3), lambda k: f"weights this version's {MODEL[k]} does not have"),
    "model as a list": (field("model", lambda c, k: list(c["model"].values())), "holds model = a list of"),
    "model_args as a list": (field("model_args", lambda c, k: list(c["model_args"].items())),
                             "holds model_args = a list of"),
    "config as a list": (field("config", lambda c, k: list(c["config"].items())), "holds config = a list of"),
    "iter_num as text": (field("iter_num", lambda c, k: "2"), "holds iter_num = '2' (str), not a whole number >= 0"),
    "iter_num negative": (field("iter_num", lambda c, k: -1), "holds iter_num = -1 (int), not a whole number"),
    "kind as a list": (field("kind", lambda c, k: [k]), "(list), not one of language, vit, lra"),
    "model missing": (field("model", None), "(it lacks model)"),
    "int64 weights": (weights(lambda m: {k: v.long() if v.is_floating_point() else v for k, v in m.items()}),
                      "as int64 values where the model's are float32: weights are never cast"),
    "a weight of another shape": (weights(lambda m: {k: torch.cat([v, v]) if i == 0 else v
                                                     for i, (k, v) in enumerate(m.items())}),
                                  "does not have (1 differ;"),
    "a weight missing": (weights(lambda m: dict(list(m.items())[1:])), "is missing)"),
    "a weight as a list": (weights(lambda m: {k: v.tolist() if i == 0 else v for i, (k, v) in enumerate(m.items())}),
                           "not a dict of weights (names -> tensors)"),
    "num_threads as text": (lambda c, k: c["config"].update(num_threads="4"), "holds config['num_threads'] = '4'"),
    # issue 54, class 3: every weight finite, one line naming the tensor
    "a NaN weight": (weights(lambda m: {k: v.clone().fill_(float("nan")) if k == first_float(m) else v
                                       for k, v in m.items()}), "NaN or infinite values in "),
    "an infinite weight": (weights(lambda m: {k: v.clone().view(-1).index_fill_(0, torch.tensor([0]), float("inf"))
                                             .view(v.shape) if k == first_float(m) else v for k, v in m.items()}),
                           "holds 1 NaN or infinite value in "),
}
KIND_MEMBERS = {  # kind -> member -> (change, words)
    "language": {
        "a tokenizer without vocab_size": (lambda c, k: c["tokenizer"].pop("vocab_size"), "holds tokenizer = "),
        "a tokenizer larger than its model": (lambda c, k: c["tokenizer"].update(vocab_size=10**6), "holds tokenizer"),
        "a tokenizer as text": (field("tokenizer", lambda c, k: "char"), "holds tokenizer = 'char' (str)"),
        # issue 54, class 2: the rules an export's config.json is held to, the refusal naming the one broken
        "a vocab_size that is not whole": (lambda c, k: c["tokenizer"].update(vocab_size=float(c["tokenizer"]
                                                                                               ["vocab_size"])),
                                           "not a whole number)"),
        "a character twice": (lambda c, k: c["tokenizer"].update(chars=c["tokenizer"]["chars"][:-1] +
                                                                 c["tokenizer"]["chars"][0]),
                              "more than once (one id per character"),
        "fewer characters than ids": (lambda c, k: c["tokenizer"].update(chars=c["tokenizer"]["chars"][:-1]),
                                      "characters for a vocab_size of"),
    },
    "vit": {
        "classes of another number": (field("classes", lambda c, k: c["classes"][:-1]), "holds classes = "),
        "a config without its dataset": (lambda c, k: c["config"].pop("dataset"), "holds config['dataset'] = None"),
    },
    "lra": {},
}
RESUME_MEMBERS = {  # what a resume alone reads
    "optimizer stripped": (field("optimizer", None), "holds no optimizer (a checkpoint shared for its weights), so its "
                                                     "run cannot be resumed: start a new run from its weights with "
                                                     "--init_from=finetune --finetune_from="),
    "rng stripped": (field("rng", None), "holds no rng (a checkpoint shared for its weights)"),
    "rng malformed": (field("rng", lambda c, k: [{"python": 1}]), "holds rng = [{'python': 1}] (list), not a list of"),
    "rng of another generator": (field("rng", lambda c, k: [dict(c["rng"][0], numpy=["PCG64", [1, 2], 0, 0, 0.0])]),
                                 "not a list of RNG states"),
    "rng as text": (field("rng", lambda c, k: "seed"), "holds rng = 'seed' (str)"),
    "optimizer as a list": (field("optimizer", lambda c, k: [1, 2]), "holds optimizer = [1, 2] (list)"),
    "optimizer of another model": (lambda c, k: c["optimizer"]["param_groups"].pop(),
                                   "holds an optimizer state that does not fit its model"),
    "optimizer moments of other shapes": (lambda c, k: [s.update(exp_avg=s["exp_avg"][:1])
                                                        for s in c["optimizer"]["state"].values()],
                                          "holds an optimizer state that does not fit its model"),
    "best_val_loss as text": (field("best_val_loss", lambda c, k: "low"), "holds best_val_loss = 'low' (str)"),
    "scaler malformed": (field("scaler", lambda c, k: {"scale": "big"}), "holds scaler = {'scale': 'big'}"),
    # issue 54, class 7: a field this version does not write would be dropped by the resume's next save
    "a later version's field": (field("ema", lambda c, k: {"decay": 0.999}), "holds ema, which this version of "),
    "a NaN in the optimizer's state": (lambda c, k: next(iter(c["optimizer"]["state"].values()))["exp_avg"].fill_(
        float("nan")), "NaN or infinite values in optimizer state "),
}
TAKEN_MEMBERS = {  # the run's settings a trainer takes from the checkpoint (resume, fine-tune, --eval_only)
    "a setting as text": (lambda c, k: c["config"].update(layer_scale_init="0"),
                          "holds config['layer_scale_init'] = '0' (str), where the setting layer_scale_init takes float values"),
    "a setting out of its range": (lambda c, k: c["config"].update(layer_scale_init=-1.0),
                                   "holds settings this version refuses (layer_scale_init must not be negative"),
}


def members_for(use, kind):
    out = {**FIELD_MEMBERS, **KIND_MEMBERS[kind]}
    if use == "resume":
        out.update(RESUME_MEMBERS)
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("use", ["weights", "resume"])
def test_the_loader_refuses_every_member_for_every_use_that_reads_it(use, kind, written, tmp_path):
    """The mechanism, member by member: load_checkpoint(path, kind, use) is one line naming the
    file and the field (the scripts below reach it the same way)."""
    for i, (name, (change, words)) in enumerate(members_for(use, kind).items()):
        shared = (lambda c, k: (strip_to_weights(c, k), change(c, k))) if use == "weights" else change  # (smaller)
        path = changed(written, kind, str(tmp_path / str(i)), shared)
        with pytest.raises(cli.UserError) as refusal:
            tk.load_checkpoint(path, kind, use)
        message = str(refusal.value)
        assert message.startswith(path) and "\n" not in message, (name, message)
        assert (words(kind) if callable(words) else words) in message, (name, message)


def rotation(members, names):
    """Each member with some of the readers (cycling), every reader with several members."""
    return [(member, names[i % len(names)]) for i, member in enumerate(members)]


SCRIPT_CASES = (rotation(sorted(FIELD_MEMBERS), NAMES) + rotation(sorted(RESUME_MEMBERS), [r for r in TRAINERS
                                                                                           if "resume" in r])
                + [(member, reader) for member in sorted(TAKEN_MEMBERS) for reader in TRAINERS])


@pytest.mark.parametrize("member,reader", SCRIPT_CASES)
def test_a_field_that_is_not_what_it_must_be_is_one_line_in_every_script(member, reader, written, tmp_path,
                                                                          monkeypatch):
    kind = READERS[reader][0]
    change, words = {**FIELD_MEMBERS, **RESUME_MEMBERS, **TAKEN_MEMBERS}[member]
    path = changed(written, kind, str(tmp_path / "run"), change)
    refused_by(reader, written, tmp_path, monkeypatch, [path, words(kind) if callable(words) else words])


@pytest.mark.parametrize("reader", [r for r in NAMES if READERS[r][0] != "lra"])
def test_a_field_of_its_kind_alone_is_checked_in_its_readers(reader, written, tmp_path, monkeypatch):
    kind = READERS[reader][0]
    for i, (change, words) in enumerate(KIND_MEMBERS[kind].values()):
        root = tmp_path / str(i)
        path = changed(written, kind, str(root / "run"), change)
        refused_by(reader, written, root, monkeypatch, [path, words])


def strip_to_weights(ckpt, kind):
    """A checkpoint as people share one: what builds and reads the model, no optimizer, RNG or records."""
    for key in ("optimizer", "scaler", "rng", "best_val_loss", "best_val_acc", "test_acc_at_best_val"):
        ckpt.pop(key, None)


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_shared_without_its_optimizer_scores_and_fine_tunes_but_does_not_resume(kind, written, tmp_path,
                                                                                            monkeypatch, capsys):
    """--eval_only, evaluate.py and fine-tuning need no optimizer; a resume says how to start a new run
    from the weights, and that command runs."""
    run = str(tmp_path / "run")
    path = changed(written, kind, run, strip_to_weights)
    trainer = {"language": "train.py", "vit": "vit_train.py", "lra": "lra/train.py"}[kind]
    message = refused_by(f"{trainer} resume", written, tmp_path, monkeypatch, [f"{path} holds no optimizer, rng"])
    advised = message[message.index("--init_from=finetune"):].replace("<new folder>", str(tmp_path / "new")).split()
    argv = [a for a in arguments(f"{trainer} resume", written) if not a.startswith(("--out_dir=", "--init_from="))]
    assert call(trainer, *argv, *advised, "--max_iters=1", monkeypatch=monkeypatch)[0] == 0
    tuned = tk.load_checkpoint(str(tmp_path / "new"), kind, "resume")
    assert tuned["iter_num"] == 1 and "optimizer" in tuned  # a new run: its own iterations, its own optimizer
    before = checkpoints.read(path)["model"]
    assert any(not torch.equal(before[k], v) for k, v in tuned["model"].items() if v.is_floating_point())
    scorer = {"language": "evaluate.py", "vit": "vit_train.py finetune", "lra": "lra/train.py --eval_only"}[kind]
    if kind != "vit":  # (vit: fine-tuned above)
        argv = [a.replace("RUN", run) for a in arguments(scorer, written)]
        assert call(READERS[scorer][2], *argv, monkeypatch=monkeypatch)[0] == 0


# -----------------------------------------------------------------------------
# 2. the model arguments: the same check in every reader, nothing dropped

MODEL_ARGS_MEMBERS = {
    "an unknown attention": (args_of(attn="not_an_attention"),
                             "names attn='not_an_attention', an attention this version does not know"),
    "an unknown Pi": (args_of(pi="not_a_pi"), "names pi='not_a_pi', a Pi this version does not know"),
    "a newer version's field": (args_of(not_a_field=10000.0),
                                lambda k: f"(model_args not_a_field are not {CONFIG[k]} fields)"),
}
SETTINGS_MEMBERS = {  # the run's settings a trainer takes: the same rules as its own
    "an unknown attention in the settings": (lambda c, k: c["config"].update(attn="not_an_attention"),
                                             "holds settings this version refuses (attn must be one of"),
    "an LRA run without its norm": (lambda c, k: [c[part].pop("norm") for part in ("config", "model_args")],
                                    "its settings lack norm"),  # (in model_args alone: taken from there)
}


@pytest.mark.parametrize("member", sorted(MODEL_ARGS_MEMBERS))
@pytest.mark.parametrize("reader", NAMES)
def test_model_arguments_this_version_does_not_know_are_one_line_in_every_reader(reader, member, written, tmp_path,
                                                                                 monkeypatch):
    kind = READERS[reader][0]
    change, words = MODEL_ARGS_MEMBERS[member]
    path = changed(written, kind, str(tmp_path / "run"), change)
    whole = open(path, "rb").read()
    refused_by(reader, written, tmp_path, monkeypatch, [path, words(kind) if callable(words) else words])
    assert open(path, "rb").read() == whole  # never resumed, never saved over without the field


@pytest.mark.parametrize("member,reader", [("an unknown attention in the settings", r) for r in TRAINERS]
                         + [("an LRA run without its norm", r) for r in TRAINERS if r.startswith("lra")])
def test_the_settings_a_trainer_takes_from_a_checkpoint_are_held_to_its_own_rules(member, reader, written, tmp_path,
                                                                                  monkeypatch):
    kind = READERS[reader][0]
    change, words = SETTINGS_MEMBERS[member]
    path = changed(written, kind, str(tmp_path / "run"), change)
    refused_by(reader, written, tmp_path, monkeypatch, [path, words])


# -----------------------------------------------------------------------------
# 3. a file of another format, named for what it is


def zipped(path, names):
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, b"\x00" * 8)


FORMATS = {  # member -> (write it at path, given the real checkpoint; the words)
    "safetensors": (lambda p, real: save_file(
        {k: v.contiguous() for k, v in checkpoints.read(real)["model"].items() if k != "lm_head.weight"}, p),
        "is a safetensors file (", "tensors: weights alone, no settings), not a checkpoint"),
    "a bare state_dict": (lambda p, real: torch.save(checkpoints.read(real)["model"], p),
                          "holds weights alone (", "a bare state_dict, as torch.save(model.state_dict()) writes)"),
    "a JSON file": (lambda p, real: open(p, "w").write(json.dumps({"n_layer": 1, "attn": "tssa"})), "is a JSON file"),
    "a text file": (lambda p, real: open(p, "w").write("n_layer = 1\n"), "is a text file, not a checkpoint"),
    "an empty file": (lambda p, real: open(p, "wb").close(), "is an empty file (0 bytes"),
    "a zip archive": (lambda p, real: zipped(p, ["run/ckpt.pt", "run/log.jsonl"]),
                      "is a zip archive of 2 file(s)", "unpack it and give run/ckpt.pt"),
    "a numpy .npz": (lambda p, real: zipped(p, ["w.npy", "b.npy"]), "is a numpy .npz archive (arrays w, b)"),
    "a numpy .npy": (lambda p, real: np.save(open(p, "wb"), np.zeros(3)), "is a numpy array (.npy)"),
    "a gzip-compressed checkpoint": (lambda p, real: open(p, "wb").write(gzip.compress(open(real, "rb").read())),
                                     "is a gzip-compressed file", "unpack it"),
    "a pickle": (lambda p, real: pickle.dump({"model": {}}, open(p, "wb"), protocol=4),
                 "is a Python pickle (pickle.dump's format, not torch.save's)", "nothing in it was read"),
}


@pytest.mark.parametrize("member", sorted(FORMATS))
@pytest.mark.parametrize("reader", NAMES)
def test_a_file_of_another_format_is_named_with_what_to_do(reader, member, written, tmp_path, monkeypatch):
    kind = READERS[reader][0]
    write, *words = FORMATS[member]
    os.makedirs(tmp_path / "run")
    path = str(tmp_path / "run" / "ckpt.pt")
    write(path, written[kind])
    refused_by(reader, written, tmp_path, monkeypatch, [path, *words])


def test_a_safetensors_file_by_its_own_name_and_a_hub_folder_are_named_with_the_way_to_load_them(written, tmp_path,
                                                                                             monkeypatch):
    """export.py's folder (issue 45): model.safetensors beside config.json, given where a run is expected."""
    hub = tmp_path / "hub"
    hub.mkdir()
    FORMATS["safetensors"][0](str(hub / "model.safetensors"), written["language"])
    (hub / "config.json").write_text(json.dumps({"model_args": {"n_layer": 1}}))
    monkeypatch.chdir(tmp_path)
    for argv in (["--ckpt_path=hub/model.safetensors"], ["--out_dir=hub"]):
        before = listing(tmp_path)
        code, message = call("sample.py", *argv)
        assert code == 1 and message.count("\n") == 0, message
        assert "--init_from=<folder>" in message and ("safetensors file" in message or "exported to share" in message)
        assert listing(tmp_path) == before
