"""
What a checkpoint holds, and how it is read: plain data, so that a checkpoint from anyone is
data and never code (trainkit's save_checkpoint writes nothing else, its load_checkpoint reads
nothing else). A library: no script here, and it imports none.

  tensor_bytes  the bytes of the tensors in a checkpoint: the room a save needs
  not_plain     where an object holds anything but tensors, bool / int / float / str / None, and
              lists, tuples and dicts of them: all that torch.load(weights_only=True) rebuilds
              without calling a function or a class named by the file
  read        torch.load(weights_only=True) onto the CPU; a file that needs any other global (a
              pickle that calls os.system, a class) raises pickle.UnpicklingError before
              anything in it runs. The one exception, read without numpy: an earlier version's
              numpy RNG states (arrays) come back as None
  other_format  what a file is when it is not torch.save's, told by its first bytes before torch
              reads it (safetensors, a pickle, JSON, text, a zip, npz, gzip, an empty file...),
              with what to do with it; weights_alone: a bare state_dict, which no settings go with

Why no allow-list: a checkpoint that needs a class or a function to load is refused, whatever
it names, rather than trusted by name (PyTorch's default since 2.6, for the same reason).
"""

import json
import os
import pickle
import zipfile
from collections import OrderedDict

import torch

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
