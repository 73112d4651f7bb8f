"""
A trained model in the Hugging Face Hub's layout: what export.py writes, what every reader loads
with --init_from=<folder or Hub id> (sample.py, evaluate.py, lm_inspect.py, the lm-eval adapter,
vit_inspect.py), and what a program of one's own loads with from_pretrained. A library: no script
here, and it imports none.

A model's folder holds three files, written as one unit (outputs.claim_set: the earlier export
whole, or this one):
  model.safetensors  the weights alone: tensors and their names, nothing that runs when read; the
                     tied embedding stored once (safetensors.torch.save_model); float32 or --dtype;
                     its header names the model_args they were written for (WRITTEN_FOR)
  config.json        what the weights are: format "nanotost", kind ("language" or "vit"),
                     architecture (in words, from the model's own fields), model_args (every field
                     of GPTConfig / ViTConfig),
                     tokenizer (language: its name, or the characters) or image (vit: size,
                     classes, the data and its evaluation crop), training (iterations, tokens or
                     images seen, val loss), nanotost (the commit that exported it), torch_dtype
  README.md          the model card: what it is, the data, the training, the command, how to load it

Writing:  FILES, checkpoint_kind, describe (config.json), weights_bytes, model_card
Reading:  resolve (a folder here, else a Hub id fetched into the Hugging Face cache), read_config
          (its fields, model_args through checkpoints.model_config), load_weights (names, shapes and
          dtypes against the model's own, before any is loaded), from_pretrained, beside. Intact
          files of another model (a fork's, another version's: fields or weights this code does not
          build) are said to be that, with the commit that exported them; damage is said as damage.
"""

import ast
import dataclasses
import json
import os
import shlex
import subprocess
import tempfile

import torch

import kernels
from model import GPT, GPTConfig, ToSTViT, ViTConfig
from nanotost import REPO, atomic, checkpoints, cli, devices, ranks, schema

FILES = ("model.safetensors", "config.json", "README.md")  # a model's folder: these, nothing else
FORMAT, FORMAT_VERSION = "nanotost", 1  # config.json's "format"; a later version's is refused
READS = (1,)  # the format versions this code reads (schema.version_problem: 0, -1 or 1.5 are none of them)
KINDS = {"language": (GPT, GPTConfig, "tokenizer"), "vit": (ToSTViT, ViTConfig, "image")}  # class, config, section
READERS = {"language": "sample.py, evaluate.py or lm_inspect.py", "vit": "vit_inspect.py"}
WHAT = {"language": "a language model", "vit": "an image classifier"}
RUN_OPTION = {"language": "--out_dir", "vit": "--ckpt", None: "loading.load_language_model or loading.load_vit_model"}
DTYPES = ("float32", "bfloat16", "float16")  # what model.safetensors may hold (--dtype)
VIT_DATA = ("dataset", "data_dir", "val_fraction", "eval_crop_pct", "shapes_train_size", "shapes_val_size",
            "shapes_num_classes", "shapes_source_size", "shapes_seed")  # which images, seen how at evaluation
HOW = "python export.py --out_dir=<run> --to=<folder>"  # how a model's folder is made
WRITTEN_FOR = "nanotost_model_args"  # model.safetensors' metadata: the model_args (JSON) its weights were written for
WORDED = {"language": ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"),  # fields the card says in words
          "vit": ("img_size", "num_classes", "n_layer", "n_head", "n_embd")}
TRAINING_ONLY = ("dropout", "drop_path", "cls_drop_path")  # fields of the training, not of the model's maths

# -----------------------------------------------------------------------------
# writing a folder (export.py)


def exported_files(folder):
    """The files of an earlier export in `folder` (FILES, known by its config.json: a nanoToST
    model's), or none: what export.py may replace there (outputs.claim_set)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            own = json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        own = False
    return FILES if own else ()


def checkpoint_kind(path):
    """The kind a checkpoint says it is ("language", "vit", "lra"), read without its tensors
    (memory-mapped); "language" where it cannot say (the loader then names what is wrong)."""
    path = os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path
    try:
        with torch.serialization.safe_globals([(checkpoints.OldArray, name) for name in checkpoints.NUMPY_ARRAY]):
            kind = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("kind")
    except Exception:  # missing, damaged, not plain data, not a dict: the loader's one line says which
        return "language"
    return kind if kind in checkpoints.KIND_MAKER else "language"


def architecture(c, kind):
    """What the weights are, in words, from the model's own fields: ToST-GPT, the softmax baseline, a variant,
    ToST-ViT, ..., and every other field whose value is not its default (a fork's own field too: ffn='ista')."""
    body = {"language": "GPT", "vit": "ViT"}[kind]
    implied = {}  # the fields a name already says
    if c.attn == "tssa":
        name = f"ToST-{body}"
    elif c.attn == "softmax" and kind == "language":
        name, implied = "GPT-2 (the softmax baseline)", {"bias": True, "layer_scale_init": None}
    else:
        name = f"{body} with {c.attn} attention" + ("" if c.attn in ("softmax", "linear") else " (a fork's)")
    extras = []
    if getattr(c, "short_conv", 0):
        extras.append(f"a causal convolution over the last {c.short_conv} tokens before each TSSA")
    if getattr(c, "hybrid_every", 0):
        extras.append(f"softmax attention in one block of every {c.hybrid_every}")
    if c.pi == "uniform":
        extras.append("Pi = 1/H (the uniform ablation)")
    elif c.pi != "softmax":
        extras.append(f"Pi by model.PI_MODES[{c.pi!r}] (a fork's)")
    said = set(WORDED[kind] + TRAINING_ONLY) | {"attn", "pi", "short_conv", "hybrid_every"}
    for field in dataclasses.fields(c):
        value = getattr(c, field.name)
        if field.name not in said and value != implied.get(field.name, field.default):
            extras.append(f"{field.name}={value!r}")
    return name + (f", with {' and '.join(extras)}" if extras else "")


def last_val(run_folder, iter_num):
    """The evaluation the run logged at iteration iter_num (its log.jsonl), or {}."""
    try:
        with open(os.path.join(run_folder, "log.jsonl"), encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError):
        return {}
    found = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a kill
            continue
        if isinstance(record, dict) and record.get("iter") == iter_num and "val_loss" in record:
            found = {k: record[k] for k in ("val_loss", "val_acc") if k in record}
    return found


def nanotost_commit():
    """{"commit": the checkout's commit, "local_changes": whether its tracked files differ}, or
    commit None where this is no git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git here
        return {"commit": None, "local_changes": None}
    if head.returncode:
        return {"commit": None, "local_changes": None}
    return {"commit": head.stdout.strip(), "local_changes": bool(status.stdout.strip())}


def trainer_defaults(script):
    """The defaults of a trainer's settings, from its source: each top-level `name = <expression>`
    evaluated alone (no builtins; nanotost.ranks as `ranks`), the script itself not run; one that does not
    evaluate so is left out (always shown)."""
    with open(os.path.join(REPO, script), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = eval(compile(ast.Expression(node.value), script, "eval"),
                                                 {"__builtins__": {}, "ranks": ranks})
            except Exception:  # (a name this evaluation does not have)
                pass
    return found


def training_command(ckpt, kind):
    """The command that trains this run again: its trainer with every setting that differs from the
    trainer's defaults (torchrun with the processes it ran on), a setting a line."""
    script, run = checkpoints.KIND_MAKER[kind], dict(ckpt.get("config") or {})
    if run.get("init_from") in ("resume", "auto"):  # how the last session began, not a setting of the run
        run.pop("init_from")
    fields = {f.name: f.default for f in dataclasses.fields(KINDS[kind][1])}  # (the trainer's settings too)
    defaults = {**fields, **trainer_defaults(script)}
    args = [f"--{k}={v}" for k, v in run.items() if k not in defaults or defaults[k] != v]
    ranks = len(ckpt.get("rng") or [None])
    start = ["torchrun", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else ["python"]
    return " \\\n    ".join([shlex.join(start + [script])] + [shlex.quote(a) for a in args])


def describe(model, ckpt, kind, dtype, run_folder):
    """config.json of a trained model (`ckpt`: its checkpoint, weights aside)."""
    c, run = model.config, ckpt.get("config") or {}
    seen = ckpt["iter_num"] * run.get("gradient_accumulation_steps", 1) * run.get("batch_size", 0)
    training = {"script": checkpoints.KIND_MAKER[kind], "dataset": run.get("dataset"), "iterations": ckpt["iter_num"],
                **({"tokens": seen * c.block_size} if kind == "language" else {"images": seen}),
                "seed": run.get("seed"), "num_threads": run.get("num_threads", 0),  # (a reader's threads: 0, its own)
                **last_val(run_folder, ckpt["iter_num"])}
    config = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "architecture": architecture(c, kind),
              "model_args": dataclasses.asdict(c)}
    if kind == "language":
        config["tokenizer"] = ckpt["tokenizer"]
    else:
        classes = ckpt.get("classes") or [str(k) for k in range(c.num_classes)]
        config["image"] = {"img_size": c.img_size, "num_classes": c.num_classes, "classes": list(classes),
                           **{k: run[k] for k in VIT_DATA if k in run}}
    return {**config, "training": training, "torch_dtype": dtype, "nanotost": nanotost_commit(),
            "parameters": sum(p.numel() for p in model.parameters())}


def weights_bytes(model, dtype):
    """model.safetensors of `model` in `dtype` (floating tensors only; the model is converted in
    place): safetensors.torch.save_model's file, the tied embedding stored once, its header naming
    the model_args the weights are of (WRITTEN_FOR: a reader tells another model from damage)."""
    from safetensors.torch import save_model

    model.to(torch.device("cpu")).to(devices.DTYPES[dtype])
    found = schema.non_finite(model.state_dict())
    if found:  # (the checkpoint's were finite: a weight beyond what dtype holds, e.g. float16's 65504)
        raise cli.UserError(f"{found[0]} holds {found[1]:,} value{'s' * (found[1] > 1)} that {dtype} cannot hold "
                            "(infinite once cast): export it as float32 or bfloat16 (--dtype)")
    written_for = json.dumps(dataclasses.asdict(model.config), sort_keys=True)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.safetensors")
        save_model(model, path, metadata={"format": "pt", WRITTEN_FOR: written_for})
        with open(path, "rb") as f:
            return f.read()


def layers(c):
    return f"{c['n_layer']} layer" + "s" * (c["n_layer"] != 1)


def model_card(config, ckpt, kind, name):
    """README.md: the model card of an exported model (`name`: its folder's name)."""
    c, t, commit = config["model_args"], config["training"], config["nanotost"]
    if kind == "language":
        tok = config["tokenizer"]
        what = (f"a language model, {layers(c)} of width {c['n_embd']} ({c['n_head']} heads), context "
                f"{c['block_size']} tokens")
        data = (f"`{t['dataset']}`, " + (f"characters ({len(tok['chars'])} of them)" if tok["tokenizer"] == "char"
                                         else f"the {tok['tokenizer']} tokenizer"))
        seen, info = f"{t['tokens']:,} tokens", "tokenizer"
        use = "python sample.py --init_from={where}  # also evaluate.py, lm_inspect.py"
    else:
        img = config["image"]
        what = (f"an image classifier, {layers(c)} of width {c['n_embd']} ({c['n_head']} heads), "
                f"{img['img_size']}x{img['img_size']} images in {img['num_classes']} classes")
        data = f"`{t['dataset']}` ({', '.join(img['classes'][:10])}{', ...' if img['num_classes'] > 10 else ''})"
        seen, info, use = f"{t['images']:,} images", "classes", "python vit_inspect.py --init_from={where}"
    val = f"val loss {t['val_loss']:.4f}" if "val_loss" in t else "no evaluation at that iteration in the run's log"
    val += f", val accuracy {t['val_acc']:.4f}" if "val_acc" in t else ""
    at = (f"commit `{commit['commit']}`" + (" with local changes" if commit["local_changes"] else "")
          if commit["commit"] else "a copy of nanoToST outside git (commit unknown)")
    arguments = ", ".join(f"`{k}={v!r}`" for k, v in c.items())
    return f"""---
tags:
- nanotost
- tost
- {"text-generation" if kind == "language" else "image-classification"}
---

# {name}

**{config['architecture']}**: {what}; {config['parameters']:,} parameters, trained with nanoToST
(the Token Statistics Transformer, ICLR 2025: attention replaced by one gradient step on a
rate-reduction objective, linear in the sequence length).

- **Data**: {data}.
- **Training**: {t['iterations']:,} iterations, {seen} seen; {val} ({t['script']}'s estimate at iteration
  {t['iterations']:,}, from its log).
- **Weights**: `model.safetensors` ({config['torch_dtype']}, tensors only), `config.json` (the model's
  arguments and what the weights are), exported by nanoToST at {at}.
- **Model arguments** (`model_args`, every field of {KINDS[kind][1].__name__}): {arguments}.

The command that trained it:

```bash
{training_command(ckpt, kind)}
```

## Load it

In a checkout of nanoToST, with this folder or its Hugging Face Hub id (`hf upload <you>/{name} <folder>`
puts it there):

```bash
{use.format(where=f"<you>/{name}")}
```

```python
from nanotost import hub
model, info = hub.from_pretrained("<you>/{name}")  # or the folder; info: {info}, iter_num
```
"""


# -----------------------------------------------------------------------------
# reading a folder (every reader's --init_from, and from_pretrained)


def not_a_folder(source, kind, why):
    """The refusal of a training run (its folder or checkpoint) where a model's folder is expected:
    `why`, and where the reader of `kind` takes a run instead."""
    return cli.UserError(f"{source} {why}: give a training run to {RUN_OPTION[kind]}, and here a model's folder "
                         f"({HOW} writes one) or its Hub id")


def resolve(source, kind=None):
    """The local folder of `source`: a folder here as it is, else a Hugging Face Hub id, whose
    files are fetched into the Hugging Face cache (HF_HOME), or taken from there offline. Where
    neither is found, one line that says which and why (`kind`: the reader's, for its advice)."""
    if os.path.isdir(source):
        return source
    if os.path.exists(source):
        raise not_a_folder(source, kind, "is a file")
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        raise cli.UserError(f"{source} is no folder here, nor a Hugging Face Hub id (owner/name): give the folder "
                            f"that {HOW} wrote, or the id of one uploaded") from None
    online = devices.hub_reachable()  # offline: the cache or nothing, at once (no ~25 s of retries)
    try:
        return huggingface_hub.snapshot_download(source, allow_patterns=list(FILES))
    except (RepositoryNotFoundError, GatedRepoError) as e:
        what = "gated: accept its terms on the Hub and `hf auth login`" if isinstance(e, GatedRepoError) else \
            "not there, or private: check the id, or `hf auth login` for a private one"
        raise cli.UserError(f"{source} is no folder here, and on the Hugging Face Hub it is {what}") from None
    except Exception as e:  # no network / offline and not in the cache, an HTTP error
        if isinstance(e, OSError) and e.filename:  # the cache's folder cannot be written: run_cli names it
            raise
        why = "offline (HF_HUB_OFFLINE, or the Hub was not reached)" if not online else \
            " ".join(str(e).split())[:160]
        raise cli.UserError(f"{source} is no folder here, and could not be fetched from the Hugging Face Hub: {why}, "
                            "and it is not in the Hugging Face cache (HF_HOME): fetch it once online, or give the "
                            "folder itself") from None


def read_config(folder, source, kind=None):
    """config.json of a model's folder, checked: a nanoToST model's, of a kind this version knows
    (`kind`, where the reader needs one), its sections there, and model_args every field of the
    model's config and nothing else, by the rules a checkpoint's are (checkpoints.model_config).
    Returns (config, the model's config dataclass)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise not_a_folder(source, kind, "holds no config.json" + " but a ckpt.pt" * os.path.isfile(
            os.path.join(folder, "ckpt.pt")))
    fix = f"export the model again ({HOW})"
    config = atomic.read_json(path, fix)
    if config.get("format") != FORMAT:
        other = config.get("model_type") or config.get("architectures") or config.get("format")
        raise cli.UserError(f"{path} is not a nanoToST model's config (no format 'nanotost'"
                            + (f"; it describes {other!r}" if other else "") + "): it is another library's model, "
                            f"which nanoToST does not run; give a folder that {HOW} wrote")
    with atomic.reading(path, fix):
        version, found = config["format_version"], config["kind"]
        if (schema.whole(version) and version > max(READS)) or found not in KINDS:
            raise cli.UserError(f"{path} was written by a later version of nanoToST (format_version {version!r}, "
                                f"kind {found!r}): load it with that version")
        problem = schema.version_problem(version, READS)
        if problem:  # (0, -1, 1.5, "1": never read as version 1)
            raise cli.UserError(f"{path}: {problem}: {fix}")
        if kind and found != kind:
            raise cli.UserError(f"{source} is {WHAT[found]} ({config.get('architecture', found)}), and this "
                                f"reads {WHAT[kind][2:]}s: give it to {READERS[found]} --init_from={source}")
        cls, config_cls, section = KINDS[found]
        args, own = config["model_args"], config[section]
        if not isinstance(args, dict) or not isinstance(own, dict):
            raise TypeError(f"model_args and {section} must be mappings")
        missing = sorted({f.name for f in dataclasses.fields(config_cls)} - set(args))
        if missing:
            raise cli.UserError(f"{path} lacks model_args {', '.join(missing)} (every field of {config_cls.__name__} "
                                f"is written by export.py): {fix}")
        unknown = sorted(set(args) - {f.name for f in dataclasses.fields(config_cls)})
        if unknown:
            raise cli.UserError(f"{source} is a model this code does not build: its model_args "
                                f"{', '.join(f'{k}={args[k]!r}' for k in unknown)} are not {config_cls.__name__} "
                                f"fields here (a fork's or another version's model{exported_at(config)}): load it "
                                "with the code that exported it")
        model_config = checkpoints.model_config(config_cls, {"model_args": args}, path)
        check_section(found, own, model_config, path, fix)
        atomic.json_number(config["training"]["iterations"], "training.iterations")
        threads = config["training"].get("num_threads", 0)  # (an earlier export's: none recorded)
        if not schema.whole(threads, 0, cli.MAX_WORKERS):
            raise cli.UserError(f"{path}: training.num_threads is {threads!r}, not a number of threads in "
                                f"0..{cli.MAX_WORKERS}: {fix}")
        if not isinstance(config["training"]["dataset"], str):
            raise TypeError("training.dataset must be the name of the data the model was trained on")
    return config, model_config


def check_section(kind, own, c, path, fix):
    """What a reader takes from config.json besides the model's arguments, checked against them
    (inside atomic.reading: a field missing or of another type is one line): the tokenizer by the
    rules a checkpoint's is held to (schema.tokenizer_problem: a whole vocab_size that fits the
    model's, a character tokenizer's characters one per id), the refusal saying which failed; the
    classes are the head's, the data named and its evaluation crop a fraction."""
    if kind == "language":
        problem = schema.tokenizer_problem(own, c.vocab_size)
        if problem:
            raise cli.UserError(f"{path}: {problem}: {fix}")
    else:
        atomic.json_number(own["eval_crop_pct"], "image.eval_crop_pct", positive=True)
        if not isinstance(own["dataset"], str):
            raise TypeError("image.dataset must be the name of the data the model was trained on")
        problem = schema.classes_problem(own["classes"], c.num_classes)
        if problem:
            raise cli.UserError(f"{path}: image.classes: {problem}: {fix}")


def exported_at(config):
    """", exported at commit <commit> (with local changes)", from config.json's nanotost section, or ""."""
    commit = config.get("nanotost") if isinstance(config.get("nanotost"), dict) else {}
    if not isinstance(commit.get("commit"), str):
        return ""
    changes = " with local changes" if commit.get("local_changes") else ""
    return f", exported at commit {commit['commit'][:12]}{changes}"


def written_for_args(text):
    """The model_args a model.safetensors header names (WRITTEN_FOR), or None (an earlier export, a damaged one)."""
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def load_weights(module, folder, source, config=None):
    """model.safetensors of a model's folder into `module`, after checking its names, shapes and
    dtypes against the module's own (a tied weight stored once counts for every name it has);
    a file cut short, damaged or of another model is one line. config: config.json's, whose
    model_args the file's header (WRITTEN_FOR) names where the two were exported together: then
    weights other than the module's are another model's (a fork's, another version's), not damage."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_model

    path = os.path.join(folder, "model.safetensors")
    redo = f"download it again, or export it again ({HOW})"
    if not os.path.isfile(path):
        raise cli.UserError(f"{source} holds no model.safetensors (the weights): {redo}")
    try:
        with safe_open(path, "pt") as f:
            stored = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}
            written_for = (f.metadata() or {}).get(WRITTEN_FOR)
    except SafetensorError as e:
        raise cli.UserError(f"{path} is not a readable safetensors file ({str(e)[:120]}): it is cut short or "
                            f"damaged; {redo}") from None
    own = module.state_dict()
    storage = {n: t.untyped_storage().data_ptr() if t.numel() else n for n, t in own.items()}
    names = {}  # a storage -> its names (the tied embedding and head: one tensor, two names)
    for name, key in storage.items():
        names.setdefault(key, []).append(name)
    other = f"config.json and model.safetensors are not of one model in {source}: {redo}"
    if config is not None and written_for_args(written_for) == config.get("model_args"):
        other = (f"{source} is another model than this code builds of its model_args (config.json and "
                 f"model.safetensors were exported together; a fork's or another version's model"
                 f"{exported_at(config)}): load it with the code that exported it")
    extra = sorted(set(stored) - set(own))
    missing = [n for n in own if not any(m in stored for m in names[storage[n]])]
    if extra or missing:
        raise cli.UserError(f"{other} (the weights " + (f"have {', '.join(extra[:3])}" if extra else "")
                            + (" and " if extra and missing else "") + (f"lack {', '.join(missing[:3])}" if missing
                                                                        else "") + ")")
    for name, (shape, dtype) in stored.items():
        if list(shape) != list(own[name].shape):
            raise cli.UserError(f"{other} ({name} is {tuple(shape)} in model.safetensors, "
                                f"{tuple(own[name].shape)} by config.json's model_args)")
        if dtype.startswith(("F", "BF")) != own[name].is_floating_point():
            raise cli.UserError(f"{path} holds {name} as {dtype}, where the model has {own[name].dtype}: {redo}")
    try:
        load_model(module, path, strict=True)
    except (SafetensorError, RuntimeError) as e:
        raise cli.UserError(f"{path} could not be read whole ({str(e)[:120]}): {redo}") from None
    found = schema.non_finite(module.state_dict())
    if found:
        raise cli.UserError(f"{path} holds {found[1]:,} NaN or infinite value{'s' * (found[1] > 1)} in {found[0]}: "
                            f"these weights cannot score or sample; {redo}")


def from_pretrained(source, device="cpu", tssa_impl="torch", kind=None):
    """The model of a folder export.py wrote, or of its Hugging Face Hub id (fetched into the
    cache once), on `device` in eval mode, TSSA run by `tssa_impl`. kind: "language" or "vit"
    where the caller needs one (another kind is one line). Nothing in the files runs: the
    weights are tensors, config.json is data, checked field by field. Returns (model, info):
    info holds what a reader takes from a checkpoint besides the weights (kind, iter_num,
    tokenizer or classes, config: the data it was trained on) and the whole config.json."""
    folder = resolve(source, kind)
    config, model_config = read_config(folder, source, kind)
    cls = KINDS[config["kind"]][0]
    model = cli.build(cls, model_config)  # (a ValueError, e.g. a forker's f: one line)
    load_weights(model, folder, source, config)
    if tssa_impl != "torch":  # fused operators in place of model.py's (a forker's own are refused)
        kernels.use(model, tssa_impl)
    training = config["training"]
    info = {"kind": config["kind"], "iter_num": training["iterations"], "folder": folder, "hub_config": config}
    if config["kind"] == "language":
        info.update(tokenizer=config["tokenizer"], config={"dataset": training["dataset"],
                                                           "num_threads": training.get("num_threads", 0)})
    else:
        image = config["image"]
        info.update(classes=image["classes"], config={**image, "seed": training.get("seed") or 0,
                                                      "num_threads": training.get("num_threads", 0)})
    return model.to(device).eval(), info


def beside(source, name):
    """Where a reader writes what it makes of a model given by --init_from (`name`: "inspect",
    "eval.jsonl"): beside its folder, <folder>-<name>, the folder as resolved (--init_from=. in
    the model's folder is that folder: ../<folder>-<name>); for a Hub id, <repository name>-<name>
    in the working folder. Never inside the model's folder (it is uploaded as it is) or the
    Hugging Face cache: a folder with nothing beside it (the root) is one line."""
    if not os.path.isdir(source):
        return source.rstrip("/").split("/")[-1] + "-" + name
    folder = os.path.abspath(source)
    if os.path.dirname(folder) == folder:
        raise cli.UserError(f"--init_from={source} is the root folder, so nothing can be written beside it: give the "
                            "output's path")
    path = folder + "-" + name
    return path if os.path.isabs(source) else os.path.relpath(path)


def check_outside(path, source, option, name):
    """Refuse, in one line, an output `path` of a reader that lies inside the model's folder
    `source` (--init_from, where it is a folder here): the folder is shared as it is exported
    (hf upload would ship it), so no reader writes in it (`name`: the output's, for the advice)."""
    if not os.path.isdir(source):
        return
    folder, out = os.path.realpath(source), os.path.realpath(path)
    if out == folder or out.startswith(folder.rstrip(os.sep) + os.sep):
        raise cli.UserError(f"{option}={path} lies inside the model's folder {source}, which is shared as it was "
                            f"exported: write it outside, e.g. {option}={beside(source, name)}")
