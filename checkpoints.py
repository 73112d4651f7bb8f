"""
What each kind of checkpoint holds, described once, and the check that a loaded one holds it,
before any reader uses it (trainkit.load_checkpoint runs it on every file it reads; how a file
is read, and what else it may be, is plaindata.py's). A library: it imports no script.

  kinds       "language" (written by train.py), "vit" (vit_train.py), "lra" (lra/train.py)
  uses        "weights": scoring, sampling, inspecting, fine-tuning, --eval_only (the weights and
              what builds and reads them); "resume": a trainer's init_from=resume, which takes
              the optimizer, the RNGs and the run's records too
  FIELDS      each field: the kinds that hold it, the uses that need it, what it must be. A
              field a use does not need is not looked at (a checkpoint shared without its
              optimizer scores, samples and fine-tunes; it does not resume, and says how to
              start a new run from its weights)
  MODEL_RANGES  the range of each model setting, by name: a checkpoint's model_args and the
              trainers' settings (cli.check, through with_model_ranges) are held to the same
  check       a checkpoint against FIELDS, one line naming the file and the field; model_args
              by the model's own rules (model_config); the weights against the model that
              model_args describe, built on the meta device (no memory, no RNG): the same names
              and shapes, floating values wherever the model's are (int64 weights are refused,
              never cast); the optimizer's state loaded into the trainers' AdamW for that model
"""

import dataclasses
import math
import random
import re
import typing
from types import SimpleNamespace

import numpy as np
import torch

import cli
import model
from cli import UserError
from lra.encoder import LRAClassifier, LRAConfig

KIND_MAKER = {"language": "train.py", "vit": "vit_train.py", "lra": "lra/train.py"}
MODELS = {"language": (model.GPTConfig, model.GPT), "vit": (model.ViTConfig, model.ToSTViT),
          "lra": (LRAConfig, LRAClassifier)}  # kind -> (its model's config, its model)
USES = ("weights", "resume")

# -----------------------------------------------------------------------------
# the ranges of the model settings, by name (every config's field of that name)

MODEL_RANGES = {
    "at_least_1": ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "num_classes", "max_len", "mlp_hidden",
                   "img_size", "patch_size", "in_chans", "n_cls_layers"),
    "non_negative": ("layer_scale_init", "short_conv", "hybrid_every"),
    "positive": ("mlp_ratio", "ln_eps"),
    "fraction": ("dropout", "drop_path", "cls_drop_path"),
}

RANGED = {key for keys in MODEL_RANGES.values() for key in keys} | {"attn", "pi", "norm"}


def model_choices():
    """The names a model setting may take (the registries as they are now: a fork's attention counts)."""
    return {"attn": tuple(model.ATTENTIONS), "pi": tuple(model.PI_MODES), "norm": ("pre", "post")}


def with_model_ranges(model_keys, **kinds):
    """cli.check's arguments for a trainer: its own settings' kinds (`kinds`) and, for its model
    settings (`model_keys`), MODEL_RANGES and model_choices: the ranges a checkpoint's model_args
    are held to, written once."""
    merged = {kind: tuple(kinds.get(kind, ())) + tuple(k for k in keys if k in model_keys)
              for kind, keys in MODEL_RANGES.items()}
    choices = {k: v for k, v in model_choices().items() if k in model_keys}
    return {**kinds, **merged, "choices": {**kinds.get("choices", {}), **choices}}


# -----------------------------------------------------------------------------
# the fields: (kinds that hold it, uses that need it, what it must be, the test of a value)

ALL = tuple(KIND_MAKER)
BOTH = USES
RESUME = ("resume",)


def is_count(v):
    return type(v) is int and v >= 0


def is_number(v, low=-math.inf, high=math.inf):
    return type(v) in (int, float) and not math.isnan(v) and low <= v <= high


def is_str_dict(v):
    return isinstance(v, dict) and all(type(k) is str for k in v)


def is_weights(v):
    return is_str_dict(v) and all(isinstance(t, torch.Tensor) for t in v.values())


def is_tokenizer(v, ckpt):
    vocab = ckpt.get("model_args", {}).get("vocab_size") if is_str_dict(ckpt.get("model_args")) else None
    return (is_str_dict(v) and type(v.get("tokenizer")) is str and type(v.get("vocab_size")) is int
            and 1 <= v["vocab_size"] <= (vocab if type(vocab) is int else v["vocab_size"])
            and all(type(v.get(k, "")) is str for k in ("chars", "dataset")))


def is_classes(v, ckpt):
    classes = ckpt.get("model_args", {}).get("num_classes") if is_str_dict(ckpt.get("model_args")) else None
    return type(v) is list and all(type(c) is str for c in v) and len(v) == classes


def is_optimizer(v):
    return is_str_dict(v) and isinstance(v.get("state"), dict) and type(v.get("param_groups")) is list


def is_scaler(v):
    """A GradScaler's state: empty (the run had none) or its five numbers."""
    keys = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    return isinstance(v, dict) and (not v or (set(v) == keys and all(is_number(x) for x in v.values())))


def is_rng_states(v):
    """One RNG state per process, each of which python's, numpy's and torch's generators take back
    (tried on generators of their own: the running ones are not touched)."""
    if type(v) is not list or not v:
        return False
    try:
        for state in v:
            random.Random().setstate(state["python"])
            if state["numpy"] is not None:  # (None: an earlier version's array, not read)
                name, key, *rest = state["numpy"]
                np.random.RandomState().set_state((name, np.array(key, dtype=np.uint32), *rest))
            torch.Generator().set_state(state["torch"])
            assert all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in state.get("cuda", []))
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError, AssertionError, OverflowError):
        return False
    return True


FIELDS = {
    "kind": (ALL, BOTH, "one of language, vit, lra", lambda v, c: type(v) is str and v in KIND_MAKER),
    "model": (ALL, BOTH, "a dict of weights (names -> tensors)", lambda v, c: is_weights(v)),
    "model_args": (ALL, BOTH, "a dict of the model's settings (names -> values)", lambda v, c: is_str_dict(v)),
    "config": (ALL, BOTH, "a dict of the run's settings (names -> values)", lambda v, c: is_str_dict(v)),
    "iter_num": (ALL, BOTH, "a whole number >= 0", lambda v, c: is_count(v)),
    "tokenizer": (("language",), BOTH, "a dict of the tokenizer's name, its vocab_size (1..the model's vocab_size) "
                                       "and its chars (text)", is_tokenizer),
    "classes": (("vit",), RESUME, "a list of the names of the model's num_classes classes", is_classes),
    "optimizer": (ALL, RESUME, "AdamW's state (a dict of state and param_groups)", lambda v, c: is_optimizer(v)),
    "rng": (ALL, RESUME, "a list of RNG states (python, numpy, torch), one per process", lambda v, c: is_rng_states(v)),
    "best_val_loss": (ALL, RESUME, "a number", lambda v, c: is_number(v)),
    "best_val_acc": (("vit", "lra"), RESUME, "an accuracy (a number in [0, 1])", lambda v, c: is_number(v, 0, 1)),
    "test_acc_at_best_val": (("lra",), RESUME, "an accuracy (a number in [0, 1]) or None",
                             lambda v, c: v is None or is_number(v, 0, 1)),
}
OPTIONAL = {  # read where present: (kinds, uses, what it must be, test)
    "scaler": (ALL, RESUME, "a GradScaler's state (empty, or its five numbers)", lambda v, c: is_scaler(v)),
    "classes": (("vit",), ("weights",), FIELDS["classes"][2], is_classes),
}
CONFIG_READ = {  # the run's settings that readers of the weights read where present: (kinds needing it, what, test)
    "dataset": (("vit",), "a dataset's name", lambda v: type(v) is str and v != ""),
    "data_dir": ((), "a folder's name", lambda v: type(v) is str),
    "num_threads": ((), f"a number of threads in 0..{cli.MAX_WORKERS}", lambda v: type(v) is int
                    and 0 <= v <= cli.MAX_WORKERS),
}


def shown(value):
    """A value as a message shows it: its repr cut short and its type, or a container's length."""
    if isinstance(value, (dict, list, tuple)) and len(value) > 4:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value) if not isinstance(value, torch.Tensor) else f"a tensor of shape {tuple(value.shape)}"
    return f"{text[:40]}{'...' if len(text) > 40 else ''} ({type(value).__name__})"


def check(ckpt, kind, use, path, optimizer_for=None):
    """Refuse, in one line naming `path` and the field, a checkpoint (a dict) that does not hold
    what `use` of a `kind` checkpoint needs; returns the model its model_args describe, on the meta
    device. optimizer_for(module): the trainers' optimizer, whose state a resume loads."""
    maker = KIND_MAKER[kind]
    found = ckpt.get("kind")
    if type(found) is str and found in KIND_MAKER and found != kind:
        raise UserError(f"{path} is a {found} checkpoint (written by {KIND_MAKER[found]}), not "
                        f"{'an' if kind == 'lra' else 'a'} {kind} one: give a checkpoint that {maker} wrote")
    needed = [f for f, (kinds, uses, _, _) in FIELDS.items() if kind in kinds and use in uses]
    missing = [f for f in needed if f not in ckpt]
    lacks = [f for f in missing if "weights" in FIELDS[f][1]]  # what any reader needs: another layout
    if lacks:
        raise UserError(f"{path} was not written by this version of {maker} (it lacks {', '.join(lacks)}): "
                        f"train a new one with {maker}")
    if missing:  # what a resume needs alone: a checkpoint shared for its weights
        raise UserError(f"{path} holds no {', '.join(missing)} (a checkpoint shared for its weights), so its run "
                        f"cannot be resumed: start a new run from its weights with --init_from=finetune "
                        f"--finetune_from={path} --out_dir=<new folder>")
    optional = [f for f, (kinds, uses, _, _) in OPTIONAL.items() if kind in kinds and use in uses and f in ckpt]
    for field in needed + optional:
        what, test = (FIELDS if field in needed else OPTIONAL)[field][2:]
        if not test(ckpt[field], ckpt):
            raise UserError(f"{path} holds {field} = {shown(ckpt[field])}, not {what}: the file was damaged or "
                            f"written by another program; give a checkpoint that {maker} wrote")
    for key, (needing, what, test) in CONFIG_READ.items():
        value = ckpt["config"].get(key)
        if (key in ckpt["config"] or kind in needing) and not test(value):
            raise UserError(f"{path} holds config['{key}'] = {shown(value)}, not {what}: give a checkpoint that "
                            f"{maker} wrote")
    config_cls, model_cls = MODELS[kind]
    config = model_config(config_cls, ckpt, path)
    module = meta_model(model_cls, config, ckpt["model"], path, maker)
    if use == "resume" and optimizer_for is not None:
        check_optimizer(optimizer_for(module), ckpt["optimizer"], path)
    return module


# -----------------------------------------------------------------------------
# model_args and the weights, by the model's own rules


def field_type_ok(value, hint):
    """Whether `value` is of a config field's annotated type: int, float, bool, str exactly (a float
    takes an int and is finite; a bool is no number), X | None, any other class by isinstance (a
    fork's field of a type of its own)."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, type(int | None)) else (hint,)
    for option in options:
        if option is float:
            if type(value) in (int, float) and math.isfinite(value):
                return True
        elif option in (int, bool, str, type(None)):
            if type(value) is option:
                return True
        else:
            cls = typing.get_origin(option) or option
            if not isinstance(cls, type) or isinstance(value, cls):  # (typing.Any and the like: nothing to check)
                return True
    return False


def model_config(config_cls, ckpt, path):
    """config_cls(**ckpt["model_args"]), or one line that names the field when the checkpoint's
    architecture is not this version's: a field it does not have, an attention or a Pi it does
    not know (a fork's, a later version's), a value of another type (the field's annotation), out
    of its range (MODEL_RANGES, model_choices) or refused by the config's rules between settings
    (its __post_init__). Never a guess, never a field dropped."""
    args = ckpt["model_args"]
    if not is_str_dict(args):
        raise UserError(f"{path} holds model_args of type {type(args).__name__}, not the settings of a model: "
                        "give a checkpoint that this version wrote")
    hints = typing.get_type_hints(config_cls)
    unknown = sorted(set(args) - set(hints))
    if unknown:
        raise UserError(f"{path} was written by another version of nanoToST (model_args {', '.join(unknown)} are "
                        f"not {config_cls.__name__} fields): train a new one with this version")
    wrong = next((k for k, v in args.items() if not field_type_ok(v, hints[k])), None)
    if wrong:
        hint = getattr(hints[wrong], "__name__", None) or str(hints[wrong])
        raise UserError(f"{path} holds model_args {wrong} = {shown(args[wrong])}, where {config_cls.__name__} takes "
                        f"{hint}: the file was damaged or written by another program; give a checkpoint that this "
                        "version wrote")
    if "attn" in args and args["attn"] not in model.ATTENTIONS:
        raise UserError(f"{path} names attn={args['attn']!r}, an attention this version does not know "
                        f"({', '.join(model.ATTENTIONS)}): register its class in model.ATTENTIONS (MATH.md §9), "
                        "or use the version of nanoToST that wrote it")
    if "pi" in args and args["pi"] not in model.PI_MODES:
        raise UserError(f"{path} names pi={args['pi']!r}, a Pi this version does not know "
                        f"({', '.join(model.PI_MODES)}): add its function to model.PI_MODES (MATH.md §9), or use the "
                        "version of nanoToST that wrote it")
    ranged = [k for k, v in args.items() if v is not None and k in RANGED]  # (a fork's own fields: by type)
    try:
        cli.check(SimpleNamespace(**{k: args[k] for k in ranged}), **with_model_ranges(ranged))
        return config_cls(**args)
    except (TypeError, ValueError) as e:  # cli.ConfigError of a range; the config's rules between settings
        raise UserError(f"{path} holds model_args this version refuses ({e}): use the version of nanoToST "
                        "that wrote it") from None


# parameters renamed since checkpoints were first written: (pattern of the old name, the new name)
RENAMED = ((r"(^|\.)c_in\.", r"\1w_proj."), (r"(^|\.)ls_1\.gamma$", r"\1attn_scale.weight"),
           (r"(^|\.)ls_2\.gamma$", r"\1mlp_scale.weight"), (r"(^|\.)attn\.temp$", r"\1attn.gamma"))


def renamed(state, own):
    """The weights of an earlier version under their new names (RENAMED); `own`: this model's names."""
    for old, new in RENAMED:
        state = {(key if key in own else re.sub(old, new, key)): value for key, value in state.items()}
    return state


def meta_model(model_cls, config, weights, path, maker):
    """The model of `config` on the meta device, once the weights are found to be its own: the
    same names and shapes, floating wherever its own are (an earlier version's names taken)."""
    sizes = {k: getattr(config, k) for k in ("n_layer", "n_cls_layers") if hasattr(config, k)}
    if sum(sizes.values()) > len(weights):  # each layer holds a weight: a bound before building any
        raise UserError(f"{path} holds {len(weights)} weight tensors, too few for the model_args' "
                        f"{', '.join(f'{k}={v}' for k, v in sizes.items())}: the file was damaged or written by "
                        "another program")
    cli.build(model.check_f_prime)  # a forker's f without its f' is that one line, not a fault of the file
    try:
        with torch.device("meta"):
            module = model_cls(config)
    except (ValueError, TypeError, RuntimeError) as e:  # a rule of a module's own (ToSTViT's patch_size, ...)
        raise UserError(f"{path} holds model_args this version cannot build a model of ({e}): use the version "
                        "of nanoToST that wrote it") from None
    own = module.state_dict()
    weights = renamed(weights, own)
    differ = sorted(set(own) ^ set(weights)) or [k for k in own if own[k].shape != weights[k].shape]
    if differ:
        key = differ[0]
        where = (f"{key} is {tuple(weights[key].shape)}, the model's {tuple(own[key].shape)}" if key in own and
                 key in weights else f"{key} is {'missing' if key in own else 'not one of its weights'}")
        raise UserError(f"{path} holds weights this version's {model_cls.__name__} does not have ({len(differ)} "
                        f"differ; {where}): it was written by another version of nanoToST; train a new one")
    cast = next((k for k in own if own[k].is_floating_point() != weights[k].is_floating_point()
                 or weights[k].is_complex()), None)
    if cast:
        raise UserError(f"{path} holds {cast} as {str(weights[cast].dtype)[6:]} values where the model's are "
                        f"{str(own[cast].dtype)[6:]}: weights are never cast to another kind of number; give the "
                        f"checkpoint as {maker} wrote it")
    return module


def check_optimizer(optimizer, state, path):
    """The optimizer's state loads into `optimizer` (the trainers' AdamW over the meta model): as
    many groups and parameters, each moment the shape of its parameter."""
    try:
        optimizer.load_state_dict(state)
        fits = all(s[m].shape == p.shape for p, s in optimizer.state.items() for m in ("exp_avg", "exp_avg_sq"))
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError, IndexError):
        fits = False
    if not fits:
        raise UserError(f"{path} holds an optimizer state that does not fit its model (other groups, parameters or "
                        "shapes): the file was damaged or written by another program; start a new run from its "
                        f"weights with --init_from=finetune --finetune_from={path} --out_dir=<new folder>")
