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

Why no allow-list: a checkpoint that needs a class or a function to load is refused, whatever
it names, rather than trusted by name (PyTorch's default since 2.6, for the same reason).
"""

import pickle
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
