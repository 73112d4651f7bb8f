"""
The settings that describe a model (the fields of model.py's config dataclasses, and of a forker's
config): the range of each by name, the names it may take, the type a value must have. The
trainers' settings and a checkpoint's model_args are held to the same rules, written once here.

  MODEL_RANGES, model_choices, with_model_ranges  cli.check's kinds for the model settings
  field_type_ok  a value against a config field's annotated type
"""

import math
import typing

import model


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
