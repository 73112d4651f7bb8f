"""
benchkit/part.py: one section of a report as its own process measures it (Part: its rows,
each printed and written to the part file the moment it is measured, atomically), what a
section is (Section: its time limit, what it measures, the function that measures it), why a
row does not run on this device (why_not), and the atomic JSON write every mode uses.

A section's function takes a Part S and records rows: S.attempt(key, work) measures one row
(work() -> dict of measurements; an error or out of memory is a row that says so), S.row(...)
records one as it is (a skipped row says why).
"""

import json
import os
import time
from collections import namedtuple

import torch

import cli
from benchkit.settings import row_reserve_s
from benchkit.timing import free_memory

# limit_s: its time limit in seconds; what: one line; fn(S): the function that measures it (a
# module-level function or a functools.partial of one: the section's process gets it pickled)
Section = namedtuple("Section", "limit_s what fn")
ROW_KEYS = ("arch", "impl", "backend", "mode", "B", "T")  # what identifies a row within its section
SKIP = {  # why a row does not run on this device
    "triton": "the Triton kernels run on CUDA (tests/test_kernels.py runs them under Triton's CPU interpreter)",
    "compiled": "torch.compile rows run on CUDA only (on the CPU a compile per shape outlasts the run)",
    "flash": "FlashAttention-2 is a CUDA kernel",
    "cudnn": "cuDNN attention is a CUDA kernel",
    "captured": "a CUDA graph needs CUDA",
    "gpu_check": "kernels/gpu_check.py checks the Triton kernels on a CUDA GPU",
}


def interpreting():
    """Whether the Triton kernels run under Triton's CPU interpreter here (TRITON_INTERPRET=1:
    the headline's rehearsal on the CPU sets it for its sections)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def why_not(S, what):
    """Why this device cannot run `what` (a key of SKIP), or None where it can: everything on
    CUDA; the Triton kernels on the CPU too when they are interpreted."""
    if S.cuda or (what == "triton" and interpreting()):
        return None
    return SKIP.get(what)


def fallback_note(impl):
    """Why a fused implementation ran the reference instead (its one warning), or ""."""
    if impl not in ("cpu", "triton"):
        return ""
    from kernels import fused  # imported already: the implementation ran
    cause = getattr(fused._OPS.get(impl), "fallback", None)
    return f"FELL BACK to the reference: {cause}" if cause else ""


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def row_key(row):
    """What identifies a row within its section (not its measurements)."""
    return tuple((k, row.get(k)) for k in ROW_KEYS)


def write_results(path, obj, saved=None):
    """The results as JSON, atomically (a failure leaves no file and no temp file), an error
    naming `path` rather than the temp file; `saved`: what an interrupt then leaves behind."""
    try:
        cli.write_json(path, obj, saved)
    except OSError as e:
        if e.filename and ".tmp" not in os.path.basename(str(e.filename)):
            raise
        raise OSError(e.errno, e.strerror or "could not write", path) from e


def format_report_row(section, r):
    keys = [k for k in ROW_KEYS if k in r]
    what = " ".join(f"{k}={r[k]}" for k in keys)
    if r["status"] != "ok":
        return f"  {section:<22} {what:<44} {r['status']}: {r.get('reason', '')}"
    vals = [f"{k} {r[k]:.4g}" for k in ("ms", "gpu_ms", "kernels", "peak_mb", "tokens_per_s", "mfu", "modelled_ms")
            if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
    extra = [f"{k}={r[k]}" for k in ("backend_ran",) if r.get(k)]
    return f"  {section:<22} {what:<44} " + ", ".join(vals + extra)


class Part:
    """One section's results as its process measures them: rows (each printed and written to
    the part file at once, atomically), the time left before the parent's limit. previous: the
    rows an earlier run of the section measured with the same code on the same device, kept."""

    def __init__(self, name, path, C, limit_s, previous=(), hang_after=None):
        self.name, self.path, self.C, self.hang_after = name, path, C, hang_after
        self.previous = {row_key(r): r for r in previous if r.get("status") not in ("not_run", "running")}
        self.previous_started = None
        self.cuda = C.device.startswith("cuda")
        self.deadline = time.time() + limit_s
        # time kept when a row would start: the last write, and what a row's first call may add
        self.reserve_s = row_reserve_s(C)
        self.longest_row_s = 0.0
        self.data = dict(section=name, status="running", started=now_iso(), pid=os.getpid(), rows=[])
        self.write()

    def write(self):
        with cli.atomic_write(self.path, "w") as f:
            json.dump(self.data, f, indent=1)

    def row(self, **row):
        row.setdefault("status", "ok")
        self.data["rows"].append(row)
        print(format_report_row(self.name, row), flush=True)
        self.write()
        self.hang_here()
        return row

    def hang_here(self):
        """The test hook (hang_after rows: NANOTOST_BENCH_HANG=<section>[:<rows>]): a section that
        never ends once it has that many rows."""
        if self.hang_after is not None and len(self.data["rows"]) >= self.hang_after:
            print(f"  {self.name}: hanging (NANOTOST_BENCH_HANG), {len(self.data['rows'])} rows measured", flush=True)
            time.sleep(10 ** 6)

    def time_left(self):
        return self.deadline - time.time()

    def attempt(self, key, work):
        """Measure one row: work() -> dict of measurements. Out of memory and errors are rows that
        say so; a row that would not fit in the section's remaining time is recorded as not run; a
        row an earlier, cut run of the section measured is kept."""
        old = self.previous.get(row_key(key))
        if old is not None:
            return self.row(**dict(old, kept_from=old.get("kept_from") or self.previous_started))
        if self.time_left() < self.reserve_s + 1.5 * self.longest_row_s:
            return self.row(**key, status="not_run", reason=f"the section's time limit was nearly spent "
                                                            f"({self.time_left():.0f} s left)")
        t0 = time.time()
        try:
            got = work()
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            got = dict(status="oom", reason=f"out of memory ({type(e).__name__})")
        except Exception as e:  # noqa: BLE001 (a measured failure is a row, and the section goes on)
            got = dict(status="failed", reason=f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:300]}")
        finally:
            self.longest_row_s = max(self.longest_row_s, time.time() - t0)
            free_memory(self.C)
        return self.row(**key, **got)

    def finish(self, status, **info):
        self.data.update(status=status, finished=now_iso(), **info)
        self.write()
