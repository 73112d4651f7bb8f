"""
The tests a trained model's two files share, ckpt.pt (checkpoints.py) and an export's config.json
(hub.py), so that one value is held to one rule whichever file holds it, and a refusal says which
rule it broke (not only that a field is "of another type"):

  whole            a whole number (an int, never 29.0 or True) within a range
  version_problem  a format version this code reads (a later one, 0, -1 or 1.5: none is read as 1)
  tokenizer_problem  a tokenizer's vocab_size (whole, 1..the model's) and, for characters, one id
                   per character: as many characters as ids, each once
  classes_problem  an image classifier's class names: one text per class of the model's head
  non_finite       the first tensor holding a NaN or an infinity (a checkpoint, an export's weights,
                   weights cast for an export)

Each *_problem returns None where the value passes, else the words of the rule it broke, which the
caller puts after the file and the field.
"""

import math

import torch


def whole(value, low=-math.inf, high=math.inf):
    """Whether value is a whole number (an int, not a bool, not a float that looks whole) in [low, high]."""
    return type(value) is int and low <= value <= high


def version_problem(value, reads):
    """None where `value` is one of the format versions `reads` (whole numbers), else why not."""
    if value in reads and whole(value):
        return None
    newest = max(reads)
    if whole(value) and value > newest:
        return f"format_version {value} is a later version's (this code reads {', '.join(map(str, reads))})"
    return f"format_version is {value!r}, not a version this code reads ({', '.join(map(str, reads))})"


def tokenizer_problem(info, model_vocab):
    """None where `info` (a checkpoint's tokenizer, an export's config.json "tokenizer") is a
    tokenizer a model of `model_vocab` ids can use, else the rule it broke: vocab_size a whole
    number in 1..model_vocab; a character tokenizer's chars a text of vocab_size characters, each
    once (token i is character i: a character twice would make two ids decode to one)."""
    if not isinstance(info, dict) or not all(type(k) is str for k in info):
        return "the tokenizer is not a mapping of names to values"
    if type(info.get("tokenizer")) is not str:
        return f"tokenizer.tokenizer is {info.get('tokenizer')!r}, not a tokenizer's name"
    n = info.get("vocab_size")
    if not whole(n):
        return f"tokenizer.vocab_size is {n!r}, not a whole number"
    top = model_vocab if whole(model_vocab) else n
    if not 1 <= n <= top:
        return f"tokenizer.vocab_size is {n}, outside 1..{top} (the model's vocab_size)"
    if any(k in info and type(info[k]) is not str for k in ("chars", "dataset")):
        return "tokenizer.chars and tokenizer.dataset must be text"
    if info["tokenizer"] != "char":
        return None
    chars = info.get("chars")
    if chars is None or len(chars) != n:
        return f"tokenizer.chars holds {len(chars or '')} characters for a vocab_size of {n} (one id per character)"
    seen = set()
    for c in chars:
        if c in seen:
            return f"tokenizer.chars holds {c!r} more than once (one id per character: two ids would decode to one)"
        seen.add(c)
    return None


def classes_problem(classes, num_classes):
    """None where `classes` names each of the model's num_classes classes (a list of texts), else why not."""
    if type(classes) is not list or not all(type(c) is str for c in classes):
        return "the classes are not a list of names"
    if len(classes) != num_classes:
        return f"{len(classes)} classes are named for a model of {num_classes} (model_args num_classes)"
    return None


def non_finite(tensors):
    """(name, how many) of the first floating tensor of `tensors` ({name: tensor}) that holds a NaN
    or an infinity, or None. Checked in chunks (a large tensor needs no mask of its own size)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
            continue
        flat = t.detach().reshape(-1)
        bad = 0
        for start in range(0, flat.numel(), 1 << 24):
            bad += int((~torch.isfinite(flat[start:start + (1 << 24)])).sum())
        if bad:
            return name, bad
    return None
