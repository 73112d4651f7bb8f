"""
The settings that describe a model (the fields of model.py's config dataclasses, and of a forker's
config): which of them a trainer takes, the range of each by name, the names it may take, the type
a value must have. The trainers' settings and a checkpoint's model_args are held to the same rules,
written once here.

  with_model_fields  a trainer's settings: its own, and every field of its model's config (one list,
                     the dataclass: a field added to model.GPTConfig is --<field> in train.py)
  MODEL_RANGES, model_choices, with_model_ranges  cli.check's kinds for the model settings
  field_type_ok  a value against a config field's annotated type
"""

import dataclasses
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
SETTABLE = (int, float, bool, str, tuple, list)  # the defaults a setting can hold (what --key=value can give)


def with_model_fields(defaults, config_cls, derived=()):
    """(settings, model keys) of a trainer: its own settings (`defaults`, from its globals: they keep the
    trainer's defaults and comments) and every field of its model's config dataclass it does not set itself,
    at the field's default; the model keys are the fields that are settings, in the dataclass's order: all but
    `derived` (what the trainer computes: the vocabulary from the data, the classes from the images) and a
    field whose default no setting can hold (None, an object: built at its default). So a field a forker adds
    to the config is a setting of every trainer of that model, saved, resumed and exported, with no edit there."""
    fields = [f for f in dataclasses.fields(config_cls) if f.name not in derived]
    extra = {f.name: f.default for f in fields if f.name not in defaults and isinstance(f.default, SETTABLE)}
    settings = {**defaults, **extra}
    return settings, tuple(f.name for f in fields if f.name in settings)


def model_choices():
    """The names a model setting may take (the registries as they are now: a fork's attention counts)."""
    return {"attn": tuple(model.ATTENTIONS), "pi": tuple(model.PI_MODES), "norm": ("pre", "post")}


def with_model_ranges(model_keys, **kinds):
    """cli.check's arguments for a trainer: its own settings' kinds (`kinds`) and, for its model
    settings (`model_keys`), MODEL_RANGES and model_choices: the ranges a checkpoint's model_args
    are held to, written once. A model setting of neither (a forker's field) is checked by its
    config's own rules (cli.build of the config, its __post_init__): cli.check's `elsewhere`."""
    merged = {kind: tuple(kinds.get(kind, ())) + tuple(k for k in keys if k in model_keys)
              for kind, keys in MODEL_RANGES.items()}
    choices = {k: v for k, v in model_choices().items() if k in model_keys}
    elsewhere = tuple(kinds.get("elsewhere", ())) + tuple(k for k in model_keys if k not in RANGED)
    return {**kinds, **merged, "choices": {**kinds.get("choices", {}), **choices}, "elsewhere": elsewhere}


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
