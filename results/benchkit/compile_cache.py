"""
results/benchkit/compile_cache.py: what torch.compile builds in one GPU window, kept for the next. A lent
GPU machine starts bare, with the same image each time; a headline compiles for minutes (each
training row's model, the decode steps, the main job's train.py). torch.compiler's cache
artifacts (save_cache_artifacts / load_cache_artifacts: Inductor's graphs with their Triton
kernels, AOTAutograd's, autotuning) carry them over:

    every process that compiles (each section's, each main job's train.py through
    results/benchkit/run_cached.py) saves its artifacts when it ends, into the command's temp folder;
    the command gathers them into one zip beside its report, <report folder>/<gpu>.compile-cache.zip
    (so it comes back from $OUT/ with the report), keeping the members of the zip it loaded that
    this run did not write again;
    at its start the next command hot-loads the zip it finds (--compile_cache=auto: beside its
    report, else results/<gpu>.compile-cache.zip, committed or copied there) into this machine's
    caches: every process after it finds its compiles there.

A cache that is another torch's, another GPU's or another code's is not used (its keys differ)
and costs only its loading. Whether it saves most of the compile time is measured by the run
itself: each row records its compile (compile_s, first_call_s, a main job's first_iter_s), and
the run's record says what the same rows took in the report the estimates came from.
--compile_cache=off loads and keeps nothing; a file's path loads that file and writes it back.
"""

import glob
import io
import os
import sys
import time
import zipfile

from nanotost import REPO, atomic

SUFFIX = ".compile-cache.zip"
PART = ".cache"  # a process's artifacts in the command's temp folder: <section part>.<stage or job>.cache


def files(cfg, out, slug, cuda):
    """(the zip to load or None, the zip to write or None) for a report at `out` on device `slug`
    (none on the CPU, where the report compiles nothing)."""
    if cfg.compile_cache == "off" or not cuda:
        return None, None
    if cfg.compile_cache != "auto":
        return (cfg.compile_cache if os.path.isfile(cfg.compile_cache) else None), cfg.compile_cache
    beside = os.path.join(os.path.dirname(out), slug + SUFFIX)
    found = [p for p in (beside, os.path.join(REPO, "results", slug + SUFFIX)) if os.path.isfile(p)]
    return (found[0] if found else None), beside


def load(path):
    """Hot-load every member of the zip at `path` into this machine's compile caches: what was
    loaded (the file, its members, artifacts by kind, seconds), or why nothing was."""
    if path is None:
        return dict(loaded=False, why="no compile cache found (this run writes one)")
    import torch
    t0, kinds = time.time(), {}
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.namelist()
            for name in members:
                info = torch.compiler.load_cache_artifacts(zf.read(name))
                for kind, keys in (info.artifacts.items() if info else ()):
                    kinds[kind] = kinds.get(kind, 0) + len(keys)
    except (OSError, zipfile.BadZipFile, EOFError) as e:  # (a damaged cache costs the compiles, nothing more)
        return dict(loaded=False, file=path, why=f"not read ({type(e).__name__}: {str(e)[:100]})")
    return dict(loaded=True, file=path, members=len(members), artifacts=kinds, load_s=round(time.time() - t0, 1))


def save_here(path):
    """This process's compile artifacts (what it compiled, and found in the caches) into `path`,
    atomically; nothing where it compiled nothing."""
    if "torch._dynamo" not in sys.modules:  # (nothing was compiled here)
        return
    import torch
    got = torch.compiler.save_cache_artifacts()
    if got:
        with atomic.atomic_write(path, "wb") as f:
            f.write(got[0])


def keeping(cfg, base):
    """The interpreter's arguments that run a script keeping its compiles into `base`.cache
    (results/benchkit/run_cached.py), or none where the command keeps none."""
    return ["-m", "results.benchkit.run_cached", base + PART] if getattr(cfg, "keep_compiles", False) else []


def gather(tmp, loaded, path):
    """The artifacts the command's processes saved in `tmp`, with the members of the zip it
    loaded that none of them wrote again, written as one zip at `path` (atomically). Returns the
    number of members written (0: nothing saved, nothing written)."""
    fresh = {os.path.basename(p)[:-len(PART)]: p for p in glob.glob(os.path.join(tmp, "*" + PART))}
    if not fresh:
        return 0
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        if loaded and os.path.isfile(loaded):
            try:
                with zipfile.ZipFile(loaded) as old:
                    for name in old.namelist():
                        if name not in fresh:
                            out.writestr(name, old.read(name))
            except (OSError, zipfile.BadZipFile, EOFError):
                pass  # (a damaged one: this run's alone)
        for name, p in sorted(fresh.items()):
            with open(p, "rb") as f:
                out.writestr(name, f.read())
        count = len(out.namelist())
    with atomic.atomic_write(path, "wb") as f:
        f.write(buffer.getvalue())
    return count
