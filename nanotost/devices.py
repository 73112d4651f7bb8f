"""
The machine a script runs on: its device and dtype ("auto" everywhere: CUDA, else Apple's MPS,
else the CPU), the CPU cores this process may use (and the threads a reader runs where nothing
names a number: suggested_threads), and whether the Hugging Face Hub answers
(offline, the Hub's libraries fail at once instead of after their retries).
"""

import math
import os
import socket
import sys

import torch

from nanotost import portable
from nanotost.cli import UserError, require


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mps_available():
    """Whether this torch can run on Apple silicon's GPU (Metal Performance Shaders)."""
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def choose_device_dtype(device, dtype):
    """device: "auto" (CUDA, else Apple's MPS, else the CPU), "cpu", "cuda", "cuda:N", "mps";
    dtype: "auto" (bfloat16 on CUDA GPUs that have it, float16 on older ones, float32 on the
    CPU and on MPS, which runs it on every macOS) or one of DTYPES. float16 on the CPU is
    refused in one line (a setting given is used or refused, never swapped for another).
    Returns (device, dtype) as strings."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    require(device in ("cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit()),
            f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but this machine has no CUDA GPU (torch {torch.__version__}); "
                        "use --device=cpu or --device=auto")
    if device == "mps" and not mps_available():
        raise UserError(f"device='mps' but this torch ({torch.__version__}) sees no Apple silicon GPU; "
                        "use --device=cpu or --device=auto")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s)")
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto" and device.startswith("cuda"):
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif dtype == "auto":  # the CPU, MPS
        dtype = "float32"
    require(not (device == "cpu" and dtype == "float16"), "dtype=float16 does not run on the CPU (its autocast with a "
            "GradScaler has no float16): give --dtype=bfloat16 (float32's range, half its memory) or float32")
    return device, dtype


def cpu_cores():
    """The CPU cores this process may run on (its affinity: a container's or a job's share), for
    default worker counts."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def suggested_threads():
    """The CPU threads a reader runs where neither its setting nor the model's run names a number:
    torch's default, less the cores other processes keep busy (the 1-minute load), at least one.
    A small model on a busy CPU runs many times faster on one thread than on contending ones."""
    load = portable.load_average()[0]
    busy = 0 if math.isnan(load) else round(load)
    return max(1, min(torch.get_num_threads(), cpu_cores() - busy))


def hub_reachable(timeout=3.0):
    """Whether the Hugging Face Hub answers (a short probe). When it does not, its libraries are
    put in offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): a cached copy still loads, and a
    missing one fails at once instead of after ~25 s of retries. Call it before loading from the
    Hub; offline settings or a proxy in the environment are left to the libraries."""
    env = os.environ
    if any(env.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return env.get("HF_HUB_OFFLINE", "0") in ("", "0") and env.get("HF_DATASETS_OFFLINE", "0") in ("", "0")
    host = env.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host.split(":")[0], 443), timeout=timeout).close()
        return True
    except OSError:
        env["HF_HUB_OFFLINE"] = env["HF_DATASETS_OFFLINE"] = "1"
        for module, name in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE")):
            if module in sys.modules:  # already imported: they read the variable at import
                setattr(sys.modules[module], name, True)
        return False
