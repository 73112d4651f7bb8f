"""
results/benchkit/part.py: one section of a report as its own process measures it (Part: its rows,
each printed and written to the part file the moment it is measured, atomically), what a
section is (Section: its time limit, what it measures, the function that measures it), why a
row does not run on this device (why_not), and the atomic JSON write every mode uses.

A section's function takes a Part S and records rows: S.attempt(key, work) measures one row
(work() -> dict of measurements; an error or out of memory is a row that says so), S.row(...)
records one as it is (a skipped row says why). A row starts only when its own estimated cost
(C.estimates, from the last report of the device: results/benchkit/costs.py) fits in what is left of the
section's time; it records what it cost (row_s). Under the headline a row outside the section's
stage (C.stage: results/benchkit/order.py) is left for that stage.
"""

import json
import os
import time
from collections import namedtuple

import torch

from nanotost import atomic
from results.benchkit.order import LATER, in_stage
from results.benchkit.settings import row_reserve_s
from results.benchkit.timing import free_memory

# limit_s: its time limit in seconds; what: one line; fn(S): the function that measures it (a
# module-level function or a functools.partial of one: the section's process gets it pickled);
# rows(C, cuda): the identifying fields of every row it measures, in its order (the plan's list)
Section = namedtuple("Section", "limit_s what fn rows")
ROW_KEYS = ("arch", "impl", "backend", "mode", "B", "T")  # what identifies a row within its section
SKIP = {  # why a row does not run on this device
    "triton": "the Triton kernels run on CUDA (tests/test_kernels.py runs them under Triton's CPU interpreter)",
    "compiled": "torch.compile rows run on CUDA only (on the CPU a compile per shape outlasts the run)",
    "flash": "FlashAttention-2 is a CUDA kernel",
    "cudnn": "cuDNN attention is a CUDA kernel",
    "captured": "a CUDA graph needs CUDA",
    "autotuned": "torch.compile rows run on CUDA only (Inductor's autotuning times its kernels on the GPU)",
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
    if impl not in ("cpu", "triton", "triton_retiled"):
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
        atomic.write_json(path, obj, saved)
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
    rows an earlier run of the section measured with the same code on the same device, kept
    (marked kept_from the part's start, unless an earlier stage of this command measured them)."""

    def __init__(self, name, path, cfg, limit_s, previous=(), hang_after=None):
        self.name, self.path, self.cfg, self.hang_after = name, path, cfg, hang_after
        self.previous = {row_key(r): r for r in previous if r.get("status") not in ("not_run", "running")}
        self.previous_started = None
        self.cuda = cfg.device.startswith("cuda")
        self.deadline = time.time() + limit_s
        self.reserve_s = row_reserve_s(cfg)  # time kept when a row would start: the last write
        self.stage = getattr(cfg, "stage", None)  # (the headline's: target or extra rows; None: every row)
        self.estimates = dict(getattr(cfg, "estimates", None) or {})  # row_key -> estimated seconds (or None)
        self.data = dict(section=name, status="running", started=now_iso(), pid=os.getpid(), rows=[])
        self.write()

    def write(self):
        with atomic.atomic_write(self.path, "w") as f:
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

    def estimate(self, key):
        """The row's estimated cost in seconds (0 where nothing is known of it)."""
        return self.estimates.get(row_key(key)) or 0.0

    def spare_s(self):
        """Seconds left once every row of the estimates not yet recorded has had its estimate:
        what an optional measurement (a profile) may take without crowding out a row."""
        done = {row_key(r) for r in self.data["rows"]}
        rows = [s or 0.0 for k, s in self.estimates.items() if k not in done and dict(k).get("mode") != "profile"]
        return self.time_left() - self.reserve_s - sum(rows)

    def attempt(self, key, work):
        """Measure one row: work() -> dict of measurements. Out of memory and errors are rows that
        say so; a row whose estimated cost does not fit in the section's remaining time is
        recorded as not run (a later, cheaper row may still run); a row an earlier, cut run of the
        section measured is kept; a row of another stage is left for it."""
        old = self.previous.get(row_key(key))
        if old is not None:
            kept = old.get("kept_from") or self.previous_started
            return self.row(**(dict(old, kept_from=kept) if kept else old))
        if not in_stage(self.name, key, self.stage):
            return self.row(**key, status="not_run", reason=LATER)
        est, left = self.estimate(key), self.time_left() - self.reserve_s
        if est > left:
            return self.row(**key, status="not_run", reason=f"its estimated {est:.0f} s did not fit in the "
                                                            f"{max(left, 0):.0f} s left of the section's time")
        t0 = time.time()
        try:
            got = work()
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            got = dict(status="oom", reason=f"out of memory ({type(e).__name__})")
        except Exception as e:  # noqa: BLE001 (a measured failure is a row, and the section goes on)
            got = dict(status="failed", reason=f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:300]}")
        finally:
            spent = time.time() - t0
            free_memory(self.cfg)
        return self.row(**key, **got, row_s=round(spent, 2))  # (what it cost: the next plan's estimate)

    def finish(self, status, **info):
        self.data.update(status=status, finished=now_iso(), **info)
        self.write()
