"""
Issue 45: a model in the Hugging Face Hub's layout (export.py, hub.py), read by every reader's
--init_from=<folder or Hub id> and by hub.from_pretrained.

  1. export.py writes model.safetensors (the weights alone, the tied embedding once), config.json
     and README.md, nothing else; the card's command trains the same weights again
  2. round trips: the same logits (float32: exactly; bfloat16: the weights rounded, exactly), the
     same samples for the same seed, in this process and in a fresh one; evaluate.py, lm_inspect.py,
     the lm-eval adapter and vit_inspect.py take the folder, and write beside it, never into it
  3. what cannot be loaded (weights cut short or damaged, a config missing, of another library or
     another model, a ViT given to sample.py, ...) and what cannot be exported: one line each,
     nothing written
  4. Hub ids without network: offline -> one line; served from the Hugging Face cache; fetched by
     a stand-in for huggingface_hub's download (and an unknown id: one line)

Everything in this process through cli.run_cli (one subprocess: the fresh process), tiny models.

    python -m pytest -q tests/test_hub.py
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sample  # noqa: E402
from nanotost import checkpoints, cli, devices, hub, loading  # noqa: E402
from test_error_classes import shapes_args  # noqa: E402
from test_errors import TINY, call, refused, write_tiny_char  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine
LM_ARGS = TINY + ["--short_conv=2"]  # a variant, so that the card and config.json must say so
SAMPLE = ["--start=abc", "--num_samples=2", "--max_new_tokens=12", "--temperature=1.0", "--device=cpu"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny language run (4 iterations) and a tiny ViT run (2), each exported in float32:
    root/{lm,vit} and root/{lm,vit}-model; root/data holds the language run's dataset."""
    root = tmp_path_factory.mktemp("hub")
    write_tiny_char(root, {"train": 3000, "val": 600})
    assert call("train.py", *LM_ARGS, f"--data_dir={root}/data", f"--out_dir={root}/lm", "--max_iters=4",
                "--eval_interval=2")[0] == 0
    assert call("vit_train.py", *shapes_args(), f"--out_dir={root}/vit", "--max_iters=2", "--eval_interval=2")[0] == 0
    for kind in ("lm", "vit"):
        assert call("export.py", f"--out_dir={root}/{kind}", f"--to={root}/{kind}-model") == (0, "")
    return root


def run_main(module, *argv):
    """module.main(argv) through cli.run_cli, as its command line runs it; returns what main returns."""
    return cli.run_cli(module.main, list(argv))


def copy_model(made, tmp_path, kind="lm", name="model"):
    return shutil.copytree(made / f"{kind}-model", tmp_path / name)


def language_ids(seed=0, B=3, T=16, V=20):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# 1. what export.py writes


def test_export_writes_the_weights_a_config_and_a_card_and_nothing_else(made):
    from safetensors import safe_open

    model_dir, ckpt = made / "lm-model", checkpoints.load_checkpoint(str(made / "lm"), "language")
    assert sorted(os.listdir(model_dir)) == sorted(hub.FILES)
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        names, metadata = set(f.keys()), f.metadata()
        stored = {k: f.get_tensor(k) for k in names}
    assert metadata["format"] == "pt"
    assert len({"wte.weight", "lm_head.weight"} & names) == 1  # the tied embedding, once
    assert names | {"wte.weight", "lm_head.weight"} == set(ckpt["model"])  # the weights, nothing else
    assert all(torch.equal(v, ckpt["model"][k]) and v.dtype == torch.float32 for k, v in stored.items())

    config = json.loads((model_dir / "config.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert config["kind"] == "language" and config["format"] == "nanotost" and config["torch_dtype"] == "float32"
    assert config["model_args"] == ckpt["model_args"] and config["tokenizer"] == ckpt["tokenizer"]
    assert config["architecture"].startswith("ToST-GPT, with a causal convolution over the last 2 tokens")
    assert config["nanotost"]["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    logged = [json.loads(line) for line in open(made / "lm" / "log.jsonl")]
    val_loss = next(r["val_loss"] for r in logged if r.get("iter") == 4 and "val_loss" in r)
    tokens = 4 * 1 * 4 * 16  # iterations x accumulation x batch x block (TINY)
    assert config["training"] == dict(script="train.py", dataset="tiny_char", iterations=4, tokens=tokens, seed=1337,
                                      num_threads=ckpt["config"]["num_threads"], val_loss=val_loss)
    assert not {"optimizer", "rng", "config", "scaler"} & set(config)

    card = (model_dir / "README.md").read_text()
    for words in ("4 iterations", f"{tokens:,} tokens seen", f"val loss {val_loss:.4f}", "`tiny_char`",
                  "characters (20 of them)", "python sample.py --init_from=", "hub.from_pretrained(", "hf upload"):
        assert words in card, words


def test_the_cards_command_trains_the_same_weights_again(made, tmp_path):
    """The card's command is the run's: run again (here, into another out_dir) it gives the same
    weights, bit for bit (one CPU thread, the same seed)."""
    card = (made / "lm-model" / "README.md").read_text()
    command = shlex.split(re.search(r"```bash\n(python train\.py.*?)\n```", card, re.S).group(1).replace("\\\n", ""))
    argv = [a if not a.startswith("--out_dir=") else f"--out_dir={tmp_path}/again" for a in command[2:]]
    assert f"--out_dir={made}/lm" in command and "--short_conv=2" in command and "--max_iters=4" in command
    assert call("train.py", *argv)[0] == 0
    again, first = (checkpoints.load_checkpoint(str(p), "language")["model"] for p in (tmp_path / "again", made / "lm"))
    assert all(torch.equal(again[k], first[k]) for k in first)


def test_export_again_replaces_its_own_folder_whole(made, tmp_path):
    copy_model(made, tmp_path, "vit", "model")  # an earlier export (of another model) in the folder
    assert call("export.py", f"--out_dir={made}/lm", f"--to={tmp_path}/model") == (0, "")
    assert sorted(os.listdir(tmp_path / "model")) == sorted(hub.FILES)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["kind"] == "language"


# -----------------------------------------------------------------------------
# 2. round trips


def test_float32_weights_come_back_exactly_the_same_logits(made):
    lm, _ = loading.load_language_model(str(made / "lm"), "cpu")
    loaded, info = hub.from_pretrained(str(made / "lm-model"))  # (no kind: what the folder holds)
    assert info["kind"] == "language" and info["iter_num"] == 4 and info["tokenizer"]["chars"] == "abcdefghijklmnopqrst"
    ids = language_ids()
    with torch.no_grad():
        assert torch.equal(lm(ids)[0], loaded(ids)[0])
    vit, _ = loading.load_vit_model(str(made / "vit"))
    vit_loaded, vinfo = hub.from_pretrained(str(made / "vit-model"))
    assert vinfo["classes"] == ["disk", "ring", "triangle", "plus"] and not vit_loaded.training
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(vit.eval()(images), vit_loaded(images))


def test_bfloat16_weights_are_the_float32_ones_rounded_exactly(made, tmp_path):
    from safetensors import safe_open

    assert call("export.py", f"--out_dir={made}/lm", f"--to={tmp_path}/bf16", "--dtype=bfloat16") == (0, "")
    with safe_open(tmp_path / "bf16" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    lm, _ = loading.load_language_model(str(made / "lm"), "cpu")
    lm.to(torch.bfloat16).to(torch.float32)  # what the file holds, read back into float32
    loaded, _ = hub.from_pretrained(str(tmp_path / "bf16"), kind="language")
    with torch.no_grad():
        assert torch.equal(lm(language_ids())[0], loaded(language_ids())[0])


def samples(capsys):
    """The texts sample.py printed (between its dashed lines)."""
    out = capsys.readouterr().out
    return [part.strip("\n") for part in out.split("-" * 60)[1:-1]]


def test_sample_gives_the_same_samples_from_the_folder_for_the_same_seed(made, capsys):
    capsys.readouterr()
    from_run = run_main(sample, f"--out_dir={made}/lm", "--seed=11", *SAMPLE)
    texts = samples(capsys)
    from_folder = run_main(sample, f"--init_from={made}/lm-model", "--seed=11", *SAMPLE)
    assert torch.equal(from_run, from_folder) and samples(capsys) == texts
    assert run_main(sample, f"--init_from={made}/lm-model", "--seed=12", *SAMPLE).tolist() != from_run.tolist()
    capsys.readouterr()


def test_a_folder_loads_in_a_fresh_process(made, capsys):
    capsys.readouterr()
    run_main(sample, f"--out_dir={made}/lm", "--seed=5", *SAMPLE)
    expected = samples(capsys)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "sample.py", f"--init_from={made}/lm-model", "--seed=5", *SAMPLE],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert [part.strip("\n") for part in p.stdout.split("-" * 60)[1:-1]] == expected
    assert p.stdout.startswith(f"{made}/lm-model (iter 4): tssa, 1 layers")


def test_evaluate_lm_inspect_and_the_adapter_read_the_folder_and_write_beside_it(made, tmp_path, capsys):
    model_dir = copy_model(made, tmp_path)
    from_run = run_main(__import__("evaluate"), f"--out_dir={made}/lm", f"--data_dir={made}/data",
                        f"--out={tmp_path}/run.jsonl", "--device=cpu")
    from_folder = run_main(__import__("evaluate"), f"--init_from={model_dir}", f"--data_dir={made}/data",
                           "--device=cpu")
    assert from_folder == from_run  # the same loss, bit for bit, on every val token
    assert [json.loads(line) for line in open(tmp_path / "model-eval.jsonl")] == [from_folder]
    page = run_main(__import__("lm_inspect"), f"--init_from={model_dir}", f"--data_dir={made}/data",
                    "--n_windows=2", "--batch_size=2")
    assert page["iter"] == 4 and os.path.isfile(tmp_path / "model-inspect" / "index.html")
    assert sorted(os.listdir(model_dir)) == sorted(hub.FILES)  # the model's folder as exported
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from nanotost import lm_eval_adapter

    lm = lm_eval_adapter.NanoToSTLM(init_from=str(model_dir), device="cpu")
    run, _ = loading.load_language_model(str(made / "lm"), "cpu")
    with torch.no_grad():
        assert torch.equal(lm.model(language_ids())[0], run(language_ids())[0]) and lm.iter_num == 4
    capsys.readouterr()


def test_vit_inspect_reads_the_folder_as_its_checkpoint(made, tmp_path, capsys):
    model_dir = copy_model(made, tmp_path, "vit")
    args = ["--n_rvar=4", "--n_show=1", "--batch_size=4"]
    from_folder = run_main(__import__("vit_inspect"), f"--init_from={model_dir}", *args)
    from_run = run_main(__import__("vit_inspect"), f"--ckpt={made}/vit", f"--out_dir={tmp_path}/run-inspect", *args)
    assert from_folder["rvar"] == from_run["rvar"] and from_folder["images"] == from_run["images"]
    assert "pi_00.png" in os.listdir(tmp_path / "model-inspect")
    assert sorted(os.listdir(model_dir)) == sorted(hub.FILES)
    capsys.readouterr()


# -----------------------------------------------------------------------------
# 3. what cannot be loaded, or exported: one line, nothing written


def edit_config(change):
    def edit(folder):
        path = folder / "config.json"
        config = json.loads(path.read_text())
        change(config)
        path.write_text(json.dumps(config))
    return edit


def cut(name, keep):
    def edit(folder):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[:keep(len(data))])
    return edit


def damage_header(folder):
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"\xff" * 32  # inside the JSON header
    path.write_bytes(bytes(data))


def integer_weights(folder):
    from safetensors.torch import load_file, save_file

    path = str(folder / "model.safetensors")
    weights = load_file(path)
    weights["ln_f.weight"] = weights["ln_f.weight"].long()
    save_file(weights, path, metadata={"format": "pt"})


def nan_weight(folder):
    from safetensors.torch import load_file, save_file

    path = str(folder / "model.safetensors")
    weights = load_file(path)
    weights["ln_f.weight"][0] = float("nan")
    save_file(weights, path, metadata={"format": "pt"})


def gpt2_config(folder):  # what a transformers GPT-2 folder's config.json holds
    (folder / "config.json").write_text(json.dumps(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"],
                                                        n_layer=12, n_head=12, n_embd=768, vocab_size=50257)))


def vit_weights(made):
    def edit(folder):
        shutil.copy(made / "vit-model" / "model.safetensors", folder / "model.safetensors")
    return edit


BROKEN = {  # what is done to a copy of the exported folder -> what the one line says
    "weights cut short": (cut("model.safetensors", lambda n: n - 100), ["model.safetensors", "cut short or damaged"]),
    "weights' header cut short": (cut("model.safetensors", lambda n: 20), ["not a readable safetensors file"]),
    "weights' header damaged": (damage_header, ["not a readable safetensors file"]),
    "weights empty": (cut("model.safetensors", lambda n: 0), ["not a readable safetensors file"]),
    "no weights": (lambda f: os.remove(f / "model.safetensors"), ["holds no model.safetensors"]),
    "no config": (lambda f: os.remove(f / "config.json"), ["holds no config.json", "--out_dir"]),
    "config cut short": (cut("config.json", lambda n: n // 2), ["config.json:", "not JSON"]),
    "config of another library's model": (gpt2_config, ["not a nanoToST model's config", "'gpt2'"]),
    "weights of another model": ("vit", ["not of one model", "the weights have", "lack"]),
    "an unknown attention": (edit_config(lambda c: c["model_args"].update(attn="not_an_attention")),
                             ["attn='not_an_attention'"]),
    "an unknown Pi": (edit_config(lambda c: c["model_args"].update(pi="not_a_pi")), ["pi='not_a_pi'"]),
    "a model argument missing": (edit_config(lambda c: c["model_args"].pop("short_conv")),
                                 ["lacks model_args short_conv"]),
    "a model argument of another version": (edit_config(lambda c: c["model_args"].update(not_a_field=1e4)),
                                            ["not_a_field"]),
    "a model argument of another type": (edit_config(lambda c: c["model_args"].update(n_head="2")),
                                         ["config.json", "model_args"]),
    "shapes that differ from the weights": (edit_config(lambda c: c["model_args"].update(n_embd=32)),
                                            ["not of one model", "by config.json's model_args"]),
    "a later format": (edit_config(lambda c: c.update(format_version=2)), ["later version of nanoToST"]),
    "no kind": (edit_config(lambda c: c.pop("kind")), ["lacks the field 'kind'"]),
    "an unknown tokenizer": (edit_config(lambda c: c["tokenizer"].update(tokenizer="sentencepiece")),
                             ["'sentencepiece'"]),
    "a vocabulary the model lacks": (edit_config(lambda c: c["tokenizer"].update(vocab_size=99)),
                                     ["tokenizer.vocab_size is 99, outside 1..64"]),  # (a range, not "another type")
    "integer weights": (integer_weights, ["ln_f.weight as I64"]),
    # issue 54, class 2: the values, by the rules a checkpoint's are held to, each refusal naming the rule
    "a vocab_size that is not whole": (edit_config(lambda c: c["tokenizer"].update(vocab_size=20.0)),
                                       ["tokenizer.vocab_size is 20.0, not a whole number"]),
    "format_version 0": (edit_config(lambda c: c.update(format_version=0)),
                         ["format_version is 0, not a version this code reads (1)"]),
    "format_version -1": (edit_config(lambda c: c.update(format_version=-1)), ["format_version is -1, not a version"]),
    "format_version 1.0": (edit_config(lambda c: c.update(format_version=1.0)),
                           ["format_version is 1.0, not a version"]),
    "format_version as text": (edit_config(lambda c: c.update(format_version="1")), ["format_version is '1', not a"]),
    "a character twice": (edit_config(lambda c: c["tokenizer"].update(chars="abcdefghijklmnopqrsa")),
                          ["tokenizer.chars holds 'a' more than once (one id per character"]),
    "fewer characters than ids": (edit_config(lambda c: c["tokenizer"].update(chars="abc")),
                                  ["tokenizer.chars holds 3 characters for a vocab_size of 20"]),
    "a vocab_size of 0": (edit_config(lambda c: c["tokenizer"].update(vocab_size=0)),
                          ["tokenizer.vocab_size is 0, outside 1..64 (the model's vocab_size)"]),
    "threads that are no number of threads": (edit_config(lambda c: c["training"].update(num_threads=-2)),
                                              ["training.num_threads is -2, not a number of threads"]),
    # class 3: every tensor finite
    "a NaN weight": (nan_weight, ["model.safetensors holds 1 NaN or infinite value in ln_f.weight"]),
    "no training record": (edit_config(lambda c: c.pop("training")), ["lacks the field 'training'"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_folder_that_cannot_be_loaded_is_one_line(case, made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    edit, words = BROKEN[case]
    model_dir = copy_model(made, tmp_path)
    (vit_weights(made) if edit == "vit" else edit)(model_dir)
    message = refused("sample.py", "--init_from=model", "--max_new_tokens=2", root=tmp_path, contains=words)
    assert "another type" not in message or "of another type" in case, message  # (a value's rule is named)


WRONG = {  # a reader given what it does not read -> its arguments, what the one line says
    "a ViT's folder to sample.py": ("sample.py", ["--init_from=vit-model"], ["is an image classifier",
                                                                           "vit_inspect.py --init_from=vit-model"]),
    "a language model's folder to vit_inspect.py": ("vit_inspect.py", ["--init_from=lm-model"],
                                                    ["is a language model", "sample.py, evaluate.py"]),
    "a run's folder to --init_from": ("sample.py", ["--init_from=lm"], ["holds no config.json but a ckpt.pt",
                                                                        "give a training run to --out_dir"]),
    "a checkpoint file to --init_from": ("vit_inspect.py", ["--init_from=vit/ckpt.pt"],
                                         ["is a file", "give a training run to --ckpt"]),
    "a model and a run at once": ("sample.py", ["--init_from=lm-model", "--out_dir=lm"],
                                  ["--init_from names the model, and so do --out_dir"]),
    "a model and a checkpoint at once": ("lm_inspect.py", ["--init_from=lm-model", "--ckpt_path=lm/ckpt.pt"],
                                         ["and so do --ckpt_path"]),
    "no folder, no id": ("evaluate.py", ["--init_from=./nowhere"], ["no folder here, nor a Hugging Face Hub id"]),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_reader_given_what_it_does_not_read_says_so_in_one_line(case, made, tmp_path, monkeypatch):
    for name in ("lm", "vit", "lm-model", "vit-model"):
        shutil.copytree(made / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    script, argv, words = WRONG[case]
    refused(script, *argv, root=tmp_path, contains=words)


@pytest.mark.parametrize("script, argv, kind", [
    ("evaluate.py", [], "lm"), ("lm_inspect.py", ["--n_windows=2"], "lm"), ("vit_inspect.py", ["--n_rvar=2"], "vit")])
def test_every_reader_refuses_damaged_weights_before_writing_anything(script, argv, kind, made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_dir = copy_model(made, tmp_path, kind)
    cut("model.safetensors", lambda n: n // 2)(model_dir)
    data = [f"--data_dir={made}/data"] if kind == "lm" else []
    refused(script, "--init_from=model", *argv, *data, root=tmp_path, contains=["cut short or damaged"])
    if kind != "lm":
        return
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from nanotost import lm_eval_adapter

    with pytest.raises(cli.UserError, match="cut short or damaged"):
        lm_eval_adapter.NanoToSTLM(init_from=str(model_dir), device="cpu")


BROKEN_VIT = {  # a ViT's config.json edited -> what vit_inspect.py's one line says
    "no classes": (lambda c: c["image"].pop("classes"), ["lacks the field 'classes'"]),
    "classes other than the head's": (lambda c: c["image"].update(classes=["disk"]), ["image.classes"]),
    "no evaluation crop": (lambda c: c["image"].pop("eval_crop_pct"), ["lacks the field 'eval_crop_pct'"]),
    "an unknown attention": (lambda c: c["model_args"].update(attn="not_an_attention"),
                             ["attn='not_an_attention'"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN_VIT))
def test_a_vit_folder_that_cannot_be_loaded_is_one_line(case, made, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    change, words = BROKEN_VIT[case]
    edit_config(change)(copy_model(made, tmp_path, "vit"))
    refused("vit_inspect.py", "--init_from=model", root=tmp_path, contains=words)


def lra_checkpoint(folder):
    os.makedirs(folder)
    torch.save(dict(kind="lra", model={}, model_args={}, config={}, iter_num=2), os.path.join(folder, "ckpt.pt"))


EXPORT_REFUSALS = {  # export.py's arguments (in a folder holding the runs) -> what the one line says
    "a folder of the user's files": (["--out_dir=lm", "--to=lm"], ["holds files export.py did not write", "ckpt.pt"]),
    "a Long Range Arena run": (["--out_dir=lra", "--to=model"], ["Long Range Arena", "lra/train.py --eval_only"]),
    "no run": (["--out_dir=nowhere", "--to=model"], ["no checkpoint at nowhere"]),
    "no folder to write": (["--out_dir=lm"], ["--to=<folder>"]),
    "an unknown dtype": (["--out_dir=lm", "--to=model", "--dtype=int8"], ["dtype must be one of"]),
}


@pytest.mark.parametrize("case", sorted(EXPORT_REFUSALS))
def test_what_export_cannot_write_is_one_line_and_nothing_is_written(case, made, tmp_path, monkeypatch):
    shutil.copytree(made / "lm", tmp_path / "lm")
    lra_checkpoint(tmp_path / "lra")
    monkeypatch.chdir(tmp_path)
    argv, words = EXPORT_REFUSALS[case]
    refused("export.py", *argv, root=tmp_path, contains=words)
    assert not os.path.exists(tmp_path / "model")


# -----------------------------------------------------------------------------
# 4. Hub ids, without network


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 (as huggingface_hub reads it, at import) and an empty Hugging Face cache."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "hf-cache"


def test_a_hub_id_offline_and_not_cached_is_one_line(offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused("sample.py", "--init_from=someone/tiny-tost", root=tmp_path,
            contains=["someone/tiny-tost is no folder here", "offline", "not in the Hugging Face cache"])


def test_a_hub_id_in_the_hugging_face_cache_loads_offline(made, offline, tmp_path, monkeypatch, capsys):
    """The cache as huggingface_hub lays it out: models--<owner>--<name>/refs/main names the
    snapshot; its files are the exported folder's."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline / "models--someone--tiny-tost"
    shutil.copytree(made / "lm-model", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    from_id = run_main(sample, "--init_from=someone/tiny-tost", "--seed=3", *SAMPLE)
    from_folder = run_main(sample, f"--init_from={made}/lm-model", "--seed=3", *SAMPLE)
    assert torch.equal(from_id, from_folder)
    assert capsys.readouterr().out.startswith("someone/tiny-tost (iter 4)")
    page = run_main(__import__("lm_inspect"), "--init_from=someone/tiny-tost", f"--data_dir={made}/data",
                    "--n_windows=2", "--batch_size=2")
    assert page["iter"] == 4 and os.path.isfile(tmp_path / "tiny-tost-inspect" / "index.html")  # here, not the cache
    capsys.readouterr()


def test_a_hub_id_is_fetched_by_huggingface_hub_and_an_unknown_one_is_one_line(made, tmp_path, monkeypatch):
    """Online, with huggingface_hub's download stood in for: the id goes to snapshot_download
    with the folder's files, and what it returns is loaded; an id it does not find is one line."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    asked = []

    def snapshot_download(repo_id, allow_patterns=None, **kw):
        asked.append((repo_id, sorted(allow_patterns)))
        if repo_id != "someone/tiny-tost":
            raise RepositoryNotFoundError("404 Client Error: Repository Not Found",
                                          response=SimpleNamespace(headers={}, request=None))
        return shutil.copytree(made / "lm-model", tmp_path / "downloaded")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(devices, "hub_reachable", lambda: True)
    model, info = hub.from_pretrained("someone/tiny-tost", kind="language")
    assert asked == [("someone/tiny-tost", sorted(hub.FILES))] and info["iter_num"] == 4
    monkeypatch.chdir(tmp_path)
    refused("sample.py", "--init_from=someone/no-such-model", root=tmp_path,
            contains=["on the Hugging Face Hub it is not there, or private"])
