"""
Checkpoints as data: what each kind holds, described once; how a file is written and read (plain
data alone: nothing in a file runs); and the check that a loaded one holds what its use needs,
before any reader uses it. A library: it imports no script.

  kinds       "language" (written by train.py), "vit" (vit_train.py), "lra" (lra/train.py, which
              registers its model: register_kind)
  uses        "weights": scoring, sampling, inspecting, fine-tuning, --eval_only (the weights and
              what builds and reads them); "resume": a trainer's init_from=resume, which takes
              the optimizer, the RNGs and the run's records too
  FIELDS      each field: the kinds that hold it, the uses that need it, what it must be. A
              field a use does not need is not looked at (a checkpoint shared without its
              optimizer scores, samples and fine-tunes; it does not resume, and says how to
              start a new run from its weights)
  save / load save_checkpoint (through atomic_write: a crash leaves the old file or the new; a full
              disk is an OSError naming it) / load_checkpoint (plain data alone, read with
              weights_only; a file of another format named for what it is; then check)
  check       a checkpoint against FIELDS, one line naming the file and the field; model_args
              by the model's own rules (model_config, model_settings.py's ranges); the weights
              against the model that model_args describe, built on the meta device (no memory, no
              RNG): the same names and shapes, floating values wherever the model's are (int64
              weights are refused, never cast), every one finite; the optimizer's state loaded into the
              trainers' AdamW for that model (optimizer_for: trainkit.load_checkpoint passes it); for a
              resume, no field this version would drop at its next save (check_closed)
  plain data  not_plain, read, other_format, weights_alone: what a checkpoint may hold (tensors,
              numbers, strings, lists, dicts: all torch.load(weights_only=True) rebuilds without
              calling a function or a class named by the file), and what else a file given as a
              checkpoint may be, told by its first bytes

Why no allow-list: a checkpoint that needs a class or a function to load is refused, whatever
it names, rather than trusted by name (PyTorch's default since 2.6, for the same reason).
"""

import errno
import typing
import json
import math
import os
import pickle
import random
import re
import shutil
import warnings
import zipfile
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import torch

import model
from nanotost import cli, schema
from nanotost.atomic import atomic_write
from nanotost.cli import UserError
from nanotost.model_settings import RANGED, field_type_ok, with_model_ranges

KIND_MAKER = {"language": "train.py", "vit": "vit_train.py", "lra": "lra/train.py"}
MODELS = {"language": (model.GPTConfig, model.GPT), "vit": (model.ViTConfig, model.ToSTViT)}  # kind -> (config, model)
USES = ("weights", "resume")



def register_kind(kind, config_cls, model_cls):
    """The model of a kind of checkpoint whose code lives above this module (lra/encoder.py's
    LRAClassifier registers itself when imported): what check builds from its model_args."""
    MODELS[kind] = (config_cls, model_cls)


# -----------------------------------------------------------------------------
# the fields: (kinds that hold it, uses that need it, what it must be, the test of a value)

ALL = tuple(KIND_MAKER)
BOTH = USES
RESUME = ("resume",)


def is_count(v):
    return schema.whole(v, 0)


def is_number(v, low=-math.inf, high=math.inf):
    return type(v) in (int, float) and not math.isnan(v) and low <= v <= high


def is_str_dict(v):
    return isinstance(v, dict) and all(type(k) is str for k in v)


def is_weights(v):
    return is_str_dict(v) and all(isinstance(t, torch.Tensor) for t in v.values())


def tokenizer_problem(v, ckpt):
    """What is wrong with a checkpoint's tokenizer (schema.tokenizer_problem: an export's rules too), or None."""
    vocab = ckpt.get("model_args", {}).get("vocab_size") if is_str_dict(ckpt.get("model_args")) else None
    return schema.tokenizer_problem(v, vocab)


def is_classes(v, ckpt):
    classes = ckpt.get("model_args", {}).get("num_classes") if is_str_dict(ckpt.get("model_args")) else None
    return schema.classes_problem(v, classes) is None


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
                                       "and its chars (text, one per id)", lambda v, c: not tokenizer_problem(v, c)),
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
WHY = {"tokenizer": tokenizer_problem}  # a field whose test says which of its rules failed: the refusal says it too
RETIRED = ("world_size", "data")  # what earlier versions wrote beside these, kept elsewhere now (rng, config)
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
    if use == "resume":
        check_closed(ckpt, kind, path, maker)
    optional = [f for f, (kinds, uses, _, _) in OPTIONAL.items() if kind in kinds and use in uses and f in ckpt]
    for field in needed + optional:
        what, test = (FIELDS if field in needed else OPTIONAL)[field][2:]
        if not test(ckpt[field], ckpt):
            why = f" ({WHY[field](ckpt[field], ckpt)})" if field in WHY else ""
            raise UserError(f"{path} holds {field} = {shown(ckpt[field])}, not {what}{why}: the file was damaged or "
                            f"written by another program; give a checkpoint that {maker} wrote")
    for key, (needing, what, test) in CONFIG_READ.items():
        value = ckpt["config"].get(key)
        if (key in ckpt["config"] or kind in needing) and not test(value):
            raise UserError(f"{path} holds config['{key}'] = {shown(value)}, not {what}: give a checkpoint that "
                            f"{maker} wrote")
    config_cls, model_cls = MODELS[kind]  # (a KeyError: the module of that kind's model was not imported)
    config = model_config(config_cls, ckpt, path)
    module = meta_model(model_cls, config, ckpt["model"], path, maker)
    if use == "resume" and optimizer_for is not None:
        check_optimizer(optimizer_for(module), ckpt["optimizer"], path)
    check_finite(ckpt, use, path, maker)
    return module


def check_closed(ckpt, kind, path, maker):
    """A resume takes every field of the checkpoint, and the next save writes the fields this
    version knows: a field it does not know (a later version's "ema", say) would be dropped
    without a word, so it is refused (the file as it was); an earlier version's records that
    this version keeps elsewhere (RETIRED) are not written again."""
    known = {f for table in (FIELDS, OPTIONAL) for f, (kinds, _, _, _) in table.items() if kind in kinds}
    unknown = sorted(set(ckpt) - known - set(RETIRED), key=str)
    if unknown:
        raise UserError(f"{path} holds {', '.join(map(str, unknown[:3]))}{' ...' if len(unknown) > 3 else ''}, "
                        f"which this version of {maker} does not write (a later version's?), and a resume would drop "
                        "at its next save: resume it with the version that wrote it, or start a new run from its "
                        f"weights with --init_from=finetune --finetune_from={path} --out_dir=<new folder>")


def check_finite(ckpt, use, path, maker):
    """Every weight finite (and, for a resume, every tensor of the optimizer's state): a NaN or an
    infinity would make every loss, sample and score NaN, so it is one line naming the tensor."""
    tensors = dict(ckpt["model"])
    for i, state in ckpt["optimizer"]["state"].items() if use == "resume" else ():
        tensors.update({f"optimizer state {i} {k}": v for k, v in dict(state).items() if isinstance(v, torch.Tensor)})
    found = schema.non_finite(tensors)
    if found:
        name, count = found
        raise UserError(f"{path} holds {count:,} NaN or infinite value{'s' * (count > 1)} in {name}: the run broke "
                        f"before it was saved; give a checkpoint of the run from before (or train again with {maker}, "
                        "e.g. a lower --learning_rate)")


# -----------------------------------------------------------------------------
# model_args and the weights, by the model's own rules


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
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the reader's own build says them: cli.build)
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


# -----------------------------------------------------------------------------
# plain data: what a checkpoint may hold, and how a file is read without running anything in it

PLAIN = (torch.Tensor, torch.nn.Parameter, bool, int, float, str, type(None))  # exact types: np.float64 is a float


def not_plain(obj, where="checkpoint"):
    """Where obj holds anything but plain data, as "a <type> at where[key]...", or None."""
    if type(obj) in (dict, OrderedDict, list, tuple):
        pairs = obj.items() if isinstance(obj, dict) else enumerate(obj)
        return next((found for key, value in pairs
                     for found in (not_plain(key, f"{where} key {key!r}"), not_plain(value, f"{where}[{key!r}]"))
                     if found), None)
    if type(obj) in PLAIN:
        return None
    what = "a numpy array" if isinstance(obj, OldArray) else f"a {type(obj).__module__}.{type(obj).__qualname__}"
    return f"{what} at {where}"


def tensor_bytes(obj):
    """Bytes of the tensors in obj (dicts, lists and tuples of them): what a checkpoint of it needs."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


# checkpoints written before issue 39 kept numpy's RNG state (np.random.get_state()) as an array,
# whose pickle names these: read back as OldArray (its bytes dropped, nothing of numpy run), it
# is taken in that place alone, as None (not_plain refuses it anywhere else)
NUMPY_ARRAY = ("numpy.ndarray", "numpy.dtype", "numpy.core.multiarray._reconstruct",
               "numpy._core.multiarray._reconstruct")


class OldArray:
    """What stands for a numpy array in an earlier checkpoint: takes its pickled parts, keeps none."""

    def __init__(self, *parts):
        pass

    def __setstate__(self, state):
        pass


def read(path):
    """torch.load(path, weights_only=True) onto the CPU: nothing in the file runs. An earlier
    version's numpy RNG states come back as None; the caller checks the rest with not_plain."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not any(f"GLOBAL {name} " in str(e) for name in NUMPY_ARRAY):
            raise
    with torch.serialization.safe_globals([(OldArray, name) for name in NUMPY_ARRAY]):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    rng = ckpt.get("rng") if isinstance(ckpt, dict) else None
    for state in rng if isinstance(rng, list) else ():
        if isinstance(state, dict) and isinstance(state.get("numpy"), tuple) and OldArray in map(type, state["numpy"]):
            state["numpy"] = None
    return ckpt


# -----------------------------------------------------------------------------
# what else a file given as a checkpoint may be

HUB_FOLDER = ("a Hub-style folder (model.safetensors beside its config.json, as export.py writes it) loads by "
              "its folder, as in sample.py --init_from=<folder> (evaluate.py, lm_inspect.py, vit_inspect.py too)")
UNPACK = "unpack it and give the checkpoint inside"
MAGIC = ((b"\x1f\x8b", "a gzip-compressed file", UNPACK), (b"BZh", "a bzip2-compressed file", UNPACK),
         (b"\xfd7zXZ\x00", "an xz-compressed file", UNPACK), (b"\x28\xb5\x2f\xfd", "a zstd-compressed file", UNPACK),
         (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", UNPACK), (b"\x93NUMPY", "a numpy array (.npy)", None),
         (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras, h5py)", None),
         (b"GGUF", "a GGUF model (llama.cpp's format)", None),
         (b"\x89PNG", "a PNG image", None), (b"\xff\xd8\xff", "a JPEG image", None))
LEGACY_TORCH = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # torch.save before 1.6: its magic number


def other_format(path):
    """(what the file is, what to do with it, or None) when it is not torch.save's, told by its
    first bytes; None for a torch.save file, whole or damaged (torch.load says which)."""
    size = os.path.getsize(path)
    if size == 0:
        return "an empty file (0 bytes: a save that never finished, or a file made by hand)", "delete it"
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PK\x03\x04"):
        return zip_format(path)
    if head.startswith(LEGACY_TORCH):
        return None
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return ("a Python pickle (pickle.dump's format, not torch.save's)",
                "nothing in it was read (loading a pickle runs its code); save it with torch.save, as plain data")
    tensors = safetensors_count(path, head, size)
    if tensors is not None:
        return f"a safetensors file ({tensors} tensors: weights alone, no settings)", HUB_FOLDER
    for magic, what, todo in MAGIC:
        if head.startswith(magic):
            return what, todo
    if head[257:262] == b"ustar":
        return "a tar archive", UNPACK
    text = as_text(head)
    if text is None:
        return None
    if text.lstrip()[:1] in ("{", "[") and size < 2**24:
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
            return "a JSON file (settings, no weights)", f"a config.json goes with its model.safetensors: {HUB_FOLDER}"
        except ValueError:
            pass
    return "a text file", None


def zip_format(path):
    """A zip archive's format: torch.save's (None: torch reads it), numpy's .npz, or another."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None  # a damaged zip: torch.save's, cut short, most likely
    if any(name.endswith("data.pkl") for name in names):
        return None
    if names and all(name.endswith(".npy") for name in names):
        shown = ", ".join(name[:-4] for name in names[:4]) + (", ..." if len(names) > 4 else "")
        return f"a numpy .npz archive (arrays {shown})", None
    inside = next((name for name in names if name.endswith((".pt", ".pth", ".safetensors"))), None)
    return f"a zip archive of {len(names)} file(s)", (f"unpack it and give {inside}" if inside else UNPACK)


def safetensors_count(path, head, size):
    """The number of tensors of a safetensors file (8 bytes: the length of a JSON header), or None."""
    length = int.from_bytes(head[:8], "little")
    if not (2 <= length <= size - 8 and head[8:9] == b"{"):
        return None
    with open(path, "rb") as f:
        f.seek(8)
        header = f.read(min(length, 2**26))
    try:
        names = json.loads(header)
    except ValueError:
        return None
    return len([k for k in names if k != "__metadata__"]) if isinstance(names, dict) else None


def as_text(head):
    """The first bytes as UTF-8 text without NUL (a character cut at the end allowed), or None."""
    if b"\x00" in head:
        return None
    for cut in range(4):
        try:
            return head[:len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def weights_alone(obj):
    """The number of tensors when obj is a bare state_dict (names -> tensors alone), else None."""
    tensors = isinstance(obj, dict) and all(type(k) is str and isinstance(v, torch.Tensor) for k, v in obj.items())
    return len(obj) if tensors and obj else None


def save_checkpoint(obj, path, saved=None):
    """torch.save through atomic_write: a crash at any moment leaves the old checkpoint or the new;
    saved: what an interrupt then leaves behind, said with the rename (atomic_write's).
    A full disk is an OSError naming path: seen before writing (free space against the tensors'
    bytes), or while writing (torch's zip writer reports it as a RuntimeError, "unexpected pos").
    Only plain data is written (not_plain): what load_checkpoint reads back, from anyone, unrun."""
    stray = not_plain(obj)
    if stray:
        raise UserError(f"{path} was not written: {stray}, and a checkpoint holds plain data alone (tensors, numbers, "
                        "strings, lists, dicts) so that anyone can load it without running code: store it as such")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    need, free = tensor_bytes(obj), shutil.disk_usage(folder).free
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device (the checkpoint needs {need:,} bytes, {free:,} are "
                                    "free)", path)
    try:
        with atomic_write(path, saved=saved) as f:
            torch.save(obj, f)
    except RuntimeError as e:
        cause = e.__context__
        if isinstance(cause, KeyboardInterrupt):  # Ctrl-C / SIGTERM while torch's writer ran: an interrupt, not a fault
            raise KeyboardInterrupt from None
        if isinstance(cause, OSError):  # the file's own error, under torch's
            raise OSError(cause.errno, cause.strerror or str(cause), path) from e
        if "inline_container" in str(e) or "PytorchStreamWriter" in str(e):
            raise OSError(errno.ENOSPC, f"No space left on device? torch's writer failed ({str(e)[:80]}), with "
                                        f"{shutil.disk_usage(folder).free:,} bytes free", path) from e
        raise


def load_checkpoint(path, kind, use="weights", optimizer_for=None):
    """A checkpoint of `kind` (a file, or the folder of its ckpt.pt), loaded onto the CPU as plain
    data (read) and checked for `use` (check): "weights" (scoring, sampling, inspecting,
    fine-tuning) or "resume" (optimizer_for(module): the trainers' optimizer, whose state it
    loads: trainkit.load_checkpoint gives it). Anything else is a UserError naming the file: missing,
    damaged, a file of another format (named for what it is), code or objects, another kind, a
    field missing or not what it must be."""
    assert use != "resume" or optimizer_for is not None, "a resume's optimizer is checked: trainkit.load_checkpoint"
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    maker, folder = KIND_MAKER[kind], os.path.dirname(path) or "."
    if not os.path.isfile(path) and os.path.isfile(os.path.join(folder, "model.safetensors")):
        raise UserError(f"{folder} holds model.safetensors and no ckpt.pt: a model exported to share, not a "
                        f"training run; {HUB_FOLDER}")
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: give the folder or file of a checkpoint that {maker} wrote, "
                        "or train one first")
    other = other_format(path)
    if other:
        raise UserError(f"{path} is {other[0]}, not a checkpoint (the ckpt.pt that {maker} writes): "
                        f"{other[1] or f'give a checkpoint that {maker} wrote'}")
    ckpt = read_plain(path, maker)
    if not isinstance(ckpt, dict):  # torch.save of a bare tensor, a list: no checkpoint's fields
        raise UserError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint (a dict of kind, model, model_args, "
                        f"config, iter_num): give a checkpoint that {maker} wrote")
    if weights_alone(ckpt):
        raise UserError(f"{path} holds weights alone ({len(ckpt)} tensors: a bare state_dict, as "
                        "torch.save(model.state_dict()) writes), and nothing says which model they fit: give the "
                        f"ckpt.pt that {maker} wrote (its weights with model_args and the run's settings)")
    check(ckpt, kind, use, path, optimizer_for=optimizer_for)
    return ckpt


def read_plain(path, maker):
    """read(path), or one line: a damaged file, or one that holds code or objects."""
    try:
        ckpt, stray = read(path), None
    except pickle.UnpicklingError as e:  # weights_only refused a global (a function, a class) or what needs one
        found = re.search(r"GLOBAL (\S+)", str(e))
        ckpt, stray = None, f"GLOBAL {found.group(1)}" if found else "pickle instructions that are not data"
    except Exception as e:  # zip errors, EOF: a damaged file
        raise UserError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e).split('. ')[0][:90]}): the "
                        "file is truncated or corrupt; delete it, or start a new run in another out_dir") from None
    stray = stray or not_plain(ckpt)  # (an array outside an earlier version's RNG states, say)
    if stray:
        raise UserError(f"{path} holds code or objects that no checkpoint of this version holds ({stray}): it was "
                        f"refused, nothing in it was run; give a checkpoint that {maker} wrote")
    return ckpt


def load_weights(module, state, path):
    """module.load_state_dict(state), the weights of an earlier version under their new names
    (checkpoints.RENAMED), or one line when the checkpoint's weights are not this version's (other
    names or shapes: written by another version of nanoToST)."""
    try:
        module.load_state_dict(renamed(state, module.state_dict()))
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise UserError(f"{path} holds weights this version's {type(module).__name__} does not have "
                        f"({detail[detail.find(':') + 1:][:120].strip()}...): it was written by another version of "
                        "nanoToST; train a new one") from None
