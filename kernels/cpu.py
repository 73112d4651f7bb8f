"""
CPU kernels: kernels/tssa_cpu.c compiled once with the system C compiler (cc -O3 -fopenmp,
cached in ~/.cache/nanotost or a per-user temp folder; without -march=native or OpenMP if the
compiler rejects them), called through ctypes.

Work is split into items (batch row b, chunk c of L tokens), spread over OpenMP threads;
inside an item tokens are walked in order and ALL heads of a token are handled together,
so w is streamed sequentially in model.split_heads' (B, T, H, p) layout and the softmax
across heads (and its backward) happens in registers, not as separate PyTorch ops.
Running sums cross chunks through carries: each pass that needs them is preceded by one
that writes chunk totals (B, nC, H, p), turned into carries by tssa_carry. The backward
rebuilds a chunk's prefix sums into an L2-sized buffer and walks it backwards.
  forward : F1 chunk sums of w^2 | F2 r, u, Pi (softmax inline), chunk sums of Pi w^2, Pi
            | F3 out
  backward: B1 chunk sums of dL/dM, dL/dN | B2 dL/dPi, softmax backward inline, Pi-path
            part of dL/dw, chunk sums of dL/dS | B3 the S-path part of dL/dw
Causal with a batch row per thread (training): one pass each way per row (tssa_seq_*).
"""

import ctypes
import errno
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
import warnings

import torch

from nanotost import cli

C_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tssa_cpu.c")


class KernelUnavailable(RuntimeError):
    """The fused kernels cannot be built or loaded here (the message says why)."""


# Flag sets tried in order: the first that builds wins. Without -march=native (compilers that
# reject it), then without OpenMP (e.g. clang with no libomp: the pragmas are ignored and the
# kernels run on one thread; the C source calls no omp_* function, so it builds either way).
C_FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])
C_COMMON = ["-fPIC", "-shared", "-std=c99"]
_c_lib_cache = []  # [lib or the KernelUnavailable error] once tried
_c_lib_lock = threading.Lock()  # one build per process, even if two threads ask at once


def cache_dirs():
    """Where the compiled kernels may live, in order: $XDG_CACHE_HOME/nanotost or
    ~/.cache/nanotost, then a per-user folder in the temp dir (read-only home directories,
    containers). Only folders we can create and write to. $NANOTOST_CACHE, where set, is the
    one place: a setting the user gave is used, or refused in one line (a file, a folder this
    process cannot write), never passed over for a default."""
    given = os.environ.get("NANOTOST_CACHE")
    if given:
        yield checked_cache_setting(given)
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates = [os.path.join(base, "nanotost"), os.path.join(tempfile.gettempdir(), f"nanotost-{uid}")]
    for root in candidates:
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError:
            continue
        owned = not hasattr(os, "getuid") or os.stat(root).st_uid == os.getuid()  # never load another user's .so
        if owned and os.access(root, os.W_OK | os.X_OK):
            yield root


def checked_cache_setting(given):
    """$NANOTOST_CACHE (`given`), made if needed, or a ConfigError in one line saying why it cannot
    be the cache and what to do."""
    try:
        os.makedirs(given, mode=0o700, exist_ok=True)
    except OSError as e:
        why = "a file stands on its path" if e.errno in (errno.EEXIST, errno.ENOTDIR) else e.strerror or str(e)
        raise cli.ConfigError(f"NANOTOST_CACHE={given!r} cannot be the cache ({why}): set it to a folder this "
                              "process can write, or unset it") from None
    owned = not hasattr(os, "getuid") or os.stat(given).st_uid == os.getuid()  # never load another user's .so
    if not owned or not os.access(given, os.W_OK | os.X_OK):
        why = "another user's folder" if not owned else "a folder this process cannot write"
        raise cli.ConfigError(f"NANOTOST_CACHE={given!r} is {why}: set it to a folder of yours that this process "
                              "can write, or unset it")
    return given


def _cpu_signature():  # -march=native code must not be reused on another CPU model
    try:
        with open("/proc/cpuinfo") as f:
            lines = [l for l in f if l.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "".join(lines) + platform.machine()


def _build(path):
    """Compile tssa_cpu.c into path with the first flag set that works. Concurrency-safe: each
    process compiles in its own temp folder and publishes the result with an atomic rename,
    so two processes building at once (torchrun ranks, pytest workers) both end with a whole
    file and nobody ever loads half of one. Raises the last build error if no flags work."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    err = None
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        tmp_so = os.path.join(tmp, "tssa_cpu.so")
        for flags in C_FLAG_SETS:
            try:
                subprocess.run([*cc, *flags, *C_COMMON, C_FILE, "-o", tmp_so, "-lm"], check=True,
                               capture_output=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as e:
                err = e
                continue
            os.replace(tmp_so, path)  # same folder, so an atomic rename
            return flags
    raise err


def c_library():
    """The compiled C kernels (ctypes.CDLL); raises KernelUnavailable if no C compiler could
    build them. Built once per process into the first writable folder of cache_dirs(), keyed
    by source, flag sets, compiler and CPU; later processes load the cached file.
    NANOTOST_NO_C=1 skips the C kernels altogether."""
    if not _c_lib_cache:
        with _c_lib_lock:
            if not _c_lib_cache:
                try:
                    _c_lib_cache.append(_load_c_library())
                except KernelUnavailable as e:
                    _c_lib_cache.append(e)
    if isinstance(_c_lib_cache[0], KernelUnavailable):
        raise _c_lib_cache[0]
    return _c_lib_cache[0]


def _load_c_library():
    no_c = os.environ.get("NANOTOST_NO_C", "")
    if no_c not in ("", "0", "1"):  # (a value given is followed or refused, never read as "unset")
        raise cli.ConfigError(f"NANOTOST_NO_C must be 1 (no C kernels) or 0, got {no_c!r}")
    if no_c == "1":
        raise KernelUnavailable("NANOTOST_NO_C=1 is set")
    with open(C_FILE) as f:
        source = f.read()
    key = (source + repr(C_FLAG_SETS + (C_COMMON,)) + os.environ.get("CC", "cc") + _cpu_signature()).encode()
    name = f"tssa_cpu_{hashlib.sha256(key).hexdigest()[:16]}.so"
    errors = []
    for root in cache_dirs():
        path = os.path.join(root, name)
        try:
            if os.path.exists(path):
                try:
                    return ctypes.CDLL(path)
                except OSError:  # not loadable (e.g. a foreign file): build it again
                    pass
            flags = _build(path)
            if flags != C_FLAG_SETS[0]:
                warnings.warn(f"kernels/cpu.py: built the C kernels with {' '.join(flags)} only (the compiler "
                              f"rejected {' '.join(C_FLAG_SETS[0])}); without -fopenmp they run on one thread.")
            return ctypes.CDLL(path)
        except (OSError, subprocess.SubprocessError) as e:
            detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")[-300:]
            errors.append(f"{root}: {e} {detail}".strip())
            if isinstance(e, (subprocess.SubprocessError, FileNotFoundError)) and not os.path.exists(path):
                break  # the compiler failed (not the folder): another folder will not help
    raise KernelUnavailable("could not build the C kernels (" + "; ".join(errors or ["no writable cache folder"])
                            + "); install a C compiler (gcc) to enable them")


def _ptr(t):  # a tensor's data pointer for ctypes (None -> NULL)
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _strides(t):  # element strides of the B, H, T dims of a (B, H, T, p) tensor
    return (ctypes.c_longlong * 3)(*t.stride()[:3])


def _nthreads():
    return ctypes.c_int(max(1, torch.get_num_threads()))


class Dims(ctypes.Structure):  # dims_t of tssa_cpu.c: the shapes and guards of one call
    _fields_ = [(n, ctypes.c_longlong) for n in ("B", "H", "T", "p", "L", "causal")] + \
               [("sq_floor", ctypes.c_float), ("stat_eps", ctypes.c_float)]


class CKernels:
    """The forward, backward and decoding step of kernels/fused.py's FusedTSSA on the CPU.
    eps = (sq_floor, stat_eps): the guards, as model.py defines them."""

    name = "cpu"
    L = 128  # tokens per work item: two (L, H, p) fp32 rebuild buffers stay in L2

    @staticmethod
    def load():  # raises KernelUnavailable where the C kernels cannot be built
        c_library()

    @staticmethod
    def unsupported(w):
        """Why these kernels cannot run w, or None."""
        return None if w.device.type == "cpu" else f"the C kernels take CPU tensors, got a {w.device.type} tensor"

    @staticmethod
    def prepare(w):  # fp32 with unit stride along p, any strides otherwise (no copy in the model)
        w = w.float()
        return w if w.stride(-1) == 1 else w.contiguous()

    @staticmethod
    def _dims(wk, causal, eps):
        B, H, T, p = wk.shape
        nC = -(-T // CKernels.L)
        return B, H, T, p, nC, ctypes.byref(Dims(B, H, T, p, CKernels.L, int(causal), *eps))

    @staticmethod
    def sequential(B, causal, mask=None):
        """One pass each way per batch row when every thread can have a row (or there is
        one thread); otherwise chunks of L tokens in parallel with carries between passes."""
        return causal and mask is None and (B >= torch.get_num_threads() or torch.get_num_threads() == 1)

    @staticmethod
    def forward(w, temp, bias, mask, causal, eps):
        lib, nth = c_library(), _nthreads()
        wk = CKernels.prepare(w)
        B, H, T, p, nC, d = CKernels._dims(wk, causal, eps)
        sw, mode = _strides(wk), ctypes.c_int(0 if causal else 2)
        carry = lambda part, K: lib.tssa_carry(_ptr(part), *(ctypes.c_longlong(n) for n in (B, nC, K)), mode)
        temp = temp.float().contiguous()
        bias = None if bias is None else bias.float()
        sbias = None if bias is None else (ctypes.c_longlong * 2)(*bias.stride())
        f32 = dict(dtype=torch.float32)  # explicit: a float64 default dtype must not reach the C pointers
        pi, u = torch.empty(B, H, T, **f32), torch.empty(B, H, T, **f32)
        cS, cM, cN = torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, **f32)
        out = torch.empty_like(wk)  # same strides as w: merging the heads afterwards is a view
        if CKernels.sequential(B, causal, mask):
            lib.tssa_seq_fwd(_ptr(wk), sw, _ptr(temp), _ptr(bias), sbias, d, _ptr(pi), _ptr(u), _ptr(out),
                             _strides(out), _ptr(cS), _ptr(cM), _ptr(cN), nth)
            return out.to(w.dtype), pi, u, (cS, cM, cN)
        lib.tssa_sum_sq(_ptr(wk), sw, d, _ptr(cS), nth)
        carry(cS, H * p)
        mask = None if mask is None else mask.float().contiguous()
        lib.tssa_fwd_pi(_ptr(wk), sw, _ptr(mask), _ptr(temp), _ptr(bias), sbias, d, _ptr(cS),
                        _ptr(pi), _ptr(u), _ptr(cM), _ptr(cN), nth)
        carry(cM, H * p)
        carry(cN, H)
        lib.tssa_fwd_out(_ptr(wk), sw, _ptr(pi), d, _ptr(cM), _ptr(cN), _ptr(out), _strides(out), nth)
        return out.to(w.dtype), pi, u, (cS, cM, cN)

    @staticmethod
    def backward(w, g, temp, pi, u, mask, saved, causal, eps):
        lib, nth = c_library(), _nthreads()
        wk, g = CKernels.prepare(w), CKernels.prepare(g)
        B, H, T, p, nC, d = CKernels._dims(wk, causal, eps)
        sw, sg, mode = _strides(wk), _strides(g), ctypes.c_int(1 if causal else 2)
        carry = lambda part, K: lib.tssa_carry(_ptr(part), *(ctypes.c_longlong(n) for n in (B, nC, K)), mode)
        cS, cM, cN = saved
        temp32 = temp.float().contiguous()
        f32 = dict(dtype=torch.float32)
        gw, gl = torch.empty_like(wk), torch.empty(B, H, T, **f32)
        if CKernels.sequential(B, causal, mask):
            gtemp_part = torch.empty(B, H, **f32)
            lib.tssa_seq_bwd(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), _ptr(u), _ptr(temp32), d, _ptr(cS), _ptr(cM),
                             _ptr(cN), _ptr(gw), _strides(gw), _ptr(gl), _ptr(gtemp_part), nth)
        else:
            cGM, cGN = torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, **f32)
            lib.tssa_bwd_sum_gm(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), d, _ptr(cM), _ptr(cN), _ptr(cGM), _ptr(cGN), nth)
            carry(cGM, H * p)
            carry(cGN, H)
            cGS, gtemp_part = torch.empty(B, nC, H, p, **f32), torch.empty(B * nC, H, **f32)
            lib.tssa_bwd_pi(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), _ptr(u), _ptr(temp32), d, _ptr(cS), _ptr(cM),
                            _ptr(cN), _ptr(cGM), _ptr(cGN), _ptr(gw), _strides(gw), _ptr(gl), _ptr(cGS),
                            _ptr(gtemp_part), nth)
            carry(cGS, H * p)
            lib.tssa_bwd_w(_ptr(wk), sw, _ptr(gl), _ptr(temp32), d, _ptr(cS), _ptr(cGS), _ptr(gw), _strides(gw), nth)
        return gw.to(w.dtype), gtemp_part.sum(0), p * temp32.view(H, 1) * gl.sum(0)

    @staticmethod
    def step(w_t, temp, bias, state, eps):
        """One decoding token: w_t (B, H, p); state tensors fp32 contiguous, updated in place."""
        B, H, p = w_t.shape
        x = w_t.float().contiguous()
        temp, bias = temp.float().contiguous(), bias.float().contiguous()
        out, pi = torch.empty(B, H, p, dtype=torch.float32), torch.empty(B, H, dtype=torch.float32)
        ll = ctypes.c_longlong
        c_library().tssa_step(_ptr(x), _ptr(temp), _ptr(bias), _ptr(state.sum_sq), _ptr(state.sum_pi_sq),
                              _ptr(state.sum_pi), _ptr(out), _ptr(pi), ll(B), ll(H), ll(p),
                              *(ctypes.c_float(e) for e in eps))
        return out.to(w_t.dtype), pi


