"""
tssa_impl="auto"'s picks kept on disk (kernels/auto.py), one small JSON file a pick: the folder
"auto" of the package's per-user cache ($NANOTOST_CACHE, else $XDG_CACHE_HOME/nanotost or
~/.cache/nanotost, else a per-user folder in the temp dir: kernels/cpu.py's cache_dirs), the file
named by a digest of the key, the key written inside it in full.

The key is everything that changes the answer: the device (the GPU's name, compute capability
and SM count, the CUDA driver's and runtime's versions), torch's and Triton's versions, a digest
of the kernels (every file of this package, and triton_tssa.py's settings as they are now), a
digest of model.py's TSSA maths as it is now (the operator functions' source, and of every
model.py function, class and constant they use), how the reference runs (eager, or compiled by
which backend), the shape class, and how the candidates are timed. A file is read only if it
is whole JSON, holds this key exactly and two finite times: anything else (damaged, foreign,
another key) is ignored with one line and timed anew. The files are data, never code. A file
found there that is no pick is replaced, never written through: a symlink in the folder is
followed only to a pick (atomic.through_link), so a link planted in a cache others can write
cannot make a run overwrite a file of the user's.

    entry = read(path, key)      # None: absent, or not usable (why: said in one line)
    write(path, key, times, pick, shape)
"""

import ctypes
import hashlib
import inspect
import json
import math
import os
import platform
import time

import torch

import model
from kernels.cpu import cache_dirs
from nanotost import atomic, cli

FOLDER = "auto"  # inside the package's cache folder
MAX_BYTES = 64 * 1024  # an entry is a few hundred bytes: a larger file is not one
STARTED = time.time()  # (a rank waiting for a pick timed anew takes only one written after this)
KERNELS = os.path.dirname(os.path.abspath(__file__))


def folder():
    """The folder that holds the picks (made if needed), or None where no cache folder can be
    written (then every pick is timed, and kept nowhere); under $NANOTOST_CACHE, that folder's
    or one line (cache_dirs)."""
    for root in cache_dirs():
        path = os.path.join(root, FOLDER)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK | os.X_OK):
            return path
    if os.environ.get("NANOTOST_CACHE"):  # (the user's setting: used or refused, never passed over)
        raise cli.ConfigError(f"NANOTOST_CACHE={os.environ['NANOTOST_CACHE']!r} holds {FOLDER}, which is not a "
                              "folder this process can write: move it, or set NANOTOST_CACHE to another folder")
    return None


def path_of(key):
    """The file of key in folder(), or None (no cache folder)."""
    root = folder()
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(root, f"{key['shape_class'][0]}-{digest}.json")


# -----------------------------------------------------------------------------
# the key


def cuda_driver():
    """The CUDA driver's version (cuDriverGetVersion, e.g. 12080), or None where it cannot be asked."""
    try:
        lib = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
        version = ctypes.c_int()
        return version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    except (OSError, AttributeError):
        return None


def device_identity(device):
    """(gpu, driver, cuda) of device: the GPU's name, capability and SM count (a MIG slice has
    fewer SMs), the driver's and the CUDA runtime's versions; on a CPU (the tests' CHECK_ON_CPU),
    the processor, and no driver."""
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name} sm_{props.major}{props.minor} {props.multi_processor_count} SMs"
        return gpu, cuda_driver(), torch.version.cuda
    return f"{device.type} {platform.machine()} {platform.processor()}".strip(), None, None


def triton_version():
    """Triton's version, or None where it is not installed."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def kernels_digest():
    """sha256 of every source file of this package (kernels/*.py, *.c), and of the Triton kernels'
    settings as they are now (triton_tssa.py's upper-case constants: a test or a forker may change
    them at run time)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(KERNELS)):
        if name.endswith((".py", ".c")):
            with open(os.path.join(KERNELS, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    try:
        import kernels.triton_tssa as tt
    except ImportError:  # no Triton: the pick is never Triton's, but the key is still well defined
        tt = None
    settings = {} if tt is None else {k: v for k, v in vars(tt).items()
                                      if k.isupper() and isinstance(v, (bool, int, float, str))}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:20]


def _source(obj):
    """The source of a function or class (where a file holds it), and a function's bytecode and
    literals (two lambdas on one line share their source, not these)."""
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        text = repr(obj) if not hasattr(obj, "__code__") else ""
    code = getattr(obj, "__code__", None)
    if code is None:
        return text
    literals = [sorted(map(repr, c)) if isinstance(c, frozenset) else c  # (a set's order changes with the hash seed)
                for c in code.co_consts if not inspect.iscode(c)]
    return text + repr((code.co_code, literals))


def _names(code):
    """Every global name code reads, its nested functions' (lambdas, comprehensions) included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def maths_digest():
    """sha256 of model.py's TSSA maths as it is now: the three operator functions model.py holds
    at this moment (a fork's replacement included), and every function (wherever defined: a
    fork's f_prime), class of their module and constant that they read, transitively
    (f_prime, prefix_sum, PI_NORM_EPS, ...)."""
    todo = [getattr(model, name) for name in model.TSSAOperators._fields]
    seen, parts = set(), []
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        parts.append(_source(obj))
        code, scope = getattr(obj, "__code__", None), getattr(obj, "__globals__", {})
        for name in sorted(_names(code)) if code else ():
            value = scope.get(name)
            if inspect.isfunction(value) or inspect.isclass(value) and value.__module__ == obj.__module__:
                todo.append(value)
            elif isinstance(value, (bool, int, float, str, tuple)):
                parts.append(f"{name} = {value!r}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def key(device, shape_class, compiled, backend, timer):
    """Everything the pick of shape_class on device depends on (a dict of JSON values).
    shape_class: (form, B, H, T, p, dtype, masked); compiled: whether the reference is timed
    compiled (by backend); timer: how the candidates are timed (kernels/auto.py's TIMER)."""
    gpu, driver, cuda = device_identity(device)
    form, B, H, T, p, dtype, masked = shape_class
    return dict(gpu=gpu, driver=driver, cuda=cuda, torch=torch.__version__, triton=triton_version(),
                kernels=kernels_digest(), maths=maths_digest(), reference=backend if compiled else "eager",
                shape_class=[form, B, H, T, p, dtype, bool(masked)], timer=timer)


# -----------------------------------------------------------------------------
# reading and writing


def positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def why_unusable(entry, key):
    """None where entry (parsed JSON) is a pick of key, else why not (a few words). A failed
    timing's entry (failed: why) picks the reference and holds no times."""
    if not isinstance(entry, dict) or entry.get("key") != key:
        return "the pick of another key" if isinstance(entry, dict) and "key" in entry else "not a pick"
    failed = entry.get("failed")
    if failed is not None:
        ok = isinstance(failed, str) and entry.get("pick") == "reference"
    else:
        ok = entry.get("pick") in ("triton", "reference") and positive(entry.get("triton_s")) and \
            positive(entry.get("reference_s"))
    return None if ok and positive(entry.get("written")) and isinstance(entry.get("shape"), list) else "not a pick"


def is_pick(path):
    """Whether the file at path is a pick of any key (what write() may write through a link to)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        entry = json.loads(data.decode("utf-8")) if len(data) <= MAX_BYTES else None
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(entry, dict) and isinstance(entry.get("key"), dict) and why_unusable(entry, entry["key"]) is None


def read(path, key, say=print):
    """The entry at path if it is a pick of key, else None; a file that exists but is no such pick
    (damaged, foreign, written by hand) is said in one line and left for write() to replace."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:  # unreadable (permissions, a folder in its place): timed anew, said
        say(f"tssa_impl=auto: ignoring the cached pick {path} ({cli.os_error_line(e)}); timing anew")
        return None
    try:
        entry = json.loads(data.decode("utf-8")) if len(data) <= MAX_BYTES else None
    except (UnicodeDecodeError, ValueError):  # (json.JSONDecodeError is a ValueError)
        entry = None
    why = why_unusable(entry, key) if len(data) <= MAX_BYTES else "larger than a pick"
    if why:
        say(f"tssa_impl=auto: ignoring the cached pick {path} ({why}); timing anew")
        return None
    return entry


def write(path, key, times, pick, shape, failed=None, say=print):
    """Keep a pick at path (atomically: a reader sees the old file or the new, never half).
    times: {"triton": s, "reference": s}, or None with failed (why the timing failed: the pick
    is then the reference, for this run's ranks only; a later run times again). shape: the
    (B, H, T, p) timed. An error of the file system is one line; the run goes on."""
    if path is None:
        return
    times = times or {}
    entry = dict(key=key, pick=pick, triton_s=times.get("triton"), reference_s=times.get("reference"),
                 shape=list(shape), written=time.time(), failed=failed)
    try:
        with atomic.atomic_write(path, "w", own=is_pick) as f:  # (a link to what is no pick: replaced, not followed)
            json.dump(entry, f, indent=1)
    except OSError as e:
        say(f"tssa_impl=auto: could not keep the pick in {path}: {cli.os_error_line(e)}")


def current(entry, fresh_only):
    """Whether a usable entry answers now: a failed timing only for the run that made it, and
    only an entry written by this run where the pick must be timed anew (fresh_only)."""
    new = entry["written"] >= STARTED
    return new if fresh_only or entry.get("failed") else True


def wait(path, key, fresh_only, timeout_s, poll_s=0.2):
    """The entry another process of this node (local rank 0) writes at path for key, once it is
    there; None after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entry = read(path, key, say=lambda line: None)  # (half-written never: the writer renames)
        if entry is not None and current(entry, fresh_only):
            return entry
        time.sleep(poll_s)
    return None
