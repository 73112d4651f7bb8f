"""
A trained model for every reader (sample.py, evaluate.py, lm_inspect.py, the lm-eval adapter,
vit_inspect.py, export.py): from a checkpoint a trainer wrote (its fields checked before any
use: checkpoints.py), from a folder export.py wrote, or from its Hugging Face Hub id (hub.py).
One call gives the model on its device in eval mode, its TSSA run by the implementation asked
for, and what the reader needs beside it (the tokenizer, the run's settings).

  load_reader_model  the model a reader's settings name (--init_from, --ckpt_path, --out_dir)
  load_language_model, load_vit_model  a train.py / vit_train.py checkpoint, or an export
  prompt_text, SAMPLING_SETTINGS / check_generation  a reader's prompt and decoding settings
"""

import dataclasses
import os
from types import SimpleNamespace

import torch

import kernels
from model import GPT, GPTConfig, ToSTViT, ViTConfig
from nanotost import checkpoints, cli, devices, hub, textdata


def load_reader_model(cfg, device, given=()):
    """(model, ckpt, path) of a reader's settings: --init_from (a folder export.py wrote, or its
    Hugging Face Hub id) where given, else --ckpt_path (where the reader has it), else
    <out_dir>/ckpt.pt; the TSSA run by cfg.tssa_impl, in eval mode on `device`. This process then
    runs cfg.num_threads CPU threads where given, else the run's own setting (reader_threads).
    --init_from with either of the others (in `given`, the settings set) is one line: a setting
    given must do something."""
    ckpt_path = getattr(cfg, "ckpt_path", "")
    both = [f"--{k}" for k in ("out_dir", "ckpt_path") if k in given or (k == "ckpt_path" and ckpt_path)]
    cli.require(not (cfg.init_from and both), f"--init_from names the model, and so do {' and '.join(both)}: "
                                              "give one of them")
    path = cfg.init_from or ckpt_path or os.path.join(cfg.out_dir, "ckpt.pt")
    model, ckpt = load_language_model(path, device, cfg.tssa_impl, exported=bool(cfg.init_from))
    reader_threads(getattr(cfg, "num_threads", 0), ckpt)
    return model, ckpt, path


def reader_threads(given, ckpt):
    """torch's CPU threads for a reader: `given` (its --num_threads) where not 0, else the training
    run's own setting (a checkpoint's, or the one an export recorded), else what the machine
    suggests (devices.suggested_threads: its free cores): a small model on a busy CPU runs far
    faster on one thread than on contending ones."""
    threads = given or ckpt.get("config", {}).get("num_threads", 0) or devices.suggested_threads()
    torch.set_num_threads(threads)
    return threads


def load_language_model(path, device, tssa_impl="torch", exported=False):
    """The GPT of a train.py checkpoint (the file, or the folder holding ckpt.pt) on `device`, in
    eval mode, its TSSA run by `tssa_impl`. Returns (model, ckpt); ckpt keeps everything but the
    weights and the optimizer state (tokenizer, iter_num, config, ...). A checkpoint naming what
    this version does not know (an attention, a Pi, a tokenizer, a model argument) is one line.
    exported: path is a folder export.py wrote, or its Hub id (hub.from_pretrained; ckpt: its info)."""
    if exported:
        gpt, info = hub.from_pretrained(path, device, tssa_impl, kind="language")
        textdata.check_tokenizer_named(info["tokenizer"], os.path.join(info["folder"], "config.json"))
        return gpt, info
    ckpt = checkpoints.load_checkpoint(path, "language")
    textdata.check_tokenizer_named(ckpt["tokenizer"], path)
    gpt = cli.build(GPT, checkpoints.model_config(GPTConfig, ckpt, path))  # (a ValueError, e.g. a forker's f: one line)
    checkpoints.load_weights(gpt, ckpt.pop("model"), path)
    ckpt.pop("optimizer", None)
    if tssa_impl != "torch":  # fused operators in place of model.py's (a forker's own are refused)
        kernels.use(gpt, tssa_impl)
    return gpt.to(device).eval(), ckpt


def prompt_text(given):
    """The text of a prompt setting: the setting itself, or the file that "FILE:path" names (a
    leading byte-order mark is no text)."""
    if not given.startswith("FILE:"):
        return given
    with open(given[len("FILE:"):], encoding="utf-8-sig") as f:
        return f.read()


SAMPLING_SETTINGS = ("max_new_tokens", "temperature", "top_k")  # none may be negative (check_generation)


def check_generation(**settings):
    """sample.py's rules for decoding settings, which lm-eval's requests follow too: whole
    max_new_tokens >= 0, temperature >= 0 (0: greedy, and a tiny one tends to it), whole
    top_k >= 0 (0: no limit). Returns them (text made numbers); a UserError names the first
    that is wrong."""
    types = {"max_new_tokens": 0, "max_gen_toks": 0, "temperature": 0.0, "top_k": 0}  # (max_gen_toks: lm-eval's)
    cfg = SimpleNamespace(**{k: cli.coerce(k, v, types[k]) for k, v in settings.items()})
    cli.check(cfg, non_negative=tuple(settings))
    return cfg


def load_vit_model(path, device="cpu", tssa_impl="torch", **overrides):
    """(model, checkpoint) of a checkpoint vit_train.py wrote (a ckpt.pt or its folder): its
    architecture (with `overrides`, e.g. img_size or dropout: nothing they change is a weight),
    its weights, TSSA run by `tssa_impl`, on `device`. Anything else is one line (trainkit)."""
    ckpt = checkpoints.load_checkpoint(path, "vit")
    config = dataclasses.replace(checkpoints.model_config(ViTConfig, ckpt, path), **overrides)
    model = cli.build(ToSTViT, config)  # (a ValueError, e.g. a forker's f: one line)
    checkpoints.load_weights(model, ckpt["model"], path)
    if tssa_impl != "torch":  # fused operators in place of model.py's (a forker's own are refused)
        kernels.use(model, tssa_impl)
    return model.to(device), ckpt
