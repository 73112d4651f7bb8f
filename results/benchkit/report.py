"""
results/benchkit/report.py: bench.py --report, one fixed protocol for a GPU in sections (SECTIONS), and
the runner it shares with --headline (results/benchkit/headline.py).

Each section runs in its own process (forked from a clean server process that never touches
CUDA) with a time limit, in its own process group (the limit ends train.py, gpu_check and the
compile workers with it; the group's keeper, results/benchkit/keeper.py, ends it once the command or
the section is gone, killed with -9 too). It writes its rows to a part file after every row
(atomically); the parent, polling that file, puts every row into the report's JSON the moment
it is measured (atomically again), so a section killed at its limit, or the whole command
killed at its own, keeps every row it finished. The JSON is valid and complete-so-far at every moment.

A section of the JSON counts as done only when it was measured by this code (its
source_sha256) on this device: a section measured by other code or elsewhere is moved to the
JSON's `history` when a run starts, and measured again (never shown as current). Run again
with sections=all, --report measures only the sections not done (a section cut short keeps the
rows it measured with this code, and measures the rest); results/render.py renders SPEED.md's
GPU tables from the JSON, and the run prints them at its end.
"""

import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial

import torch

from nanotost import REPO, atomic, cli, devices, outputs, portable
from results.benchkit import compile_cache, keeper, plan, reportfile
from results.benchkit.costs import Costs
from results.benchkit.decode import decode_rows, section_decode
from results.benchkit.gpu_check import section_gpu_check
from results.benchkit.main_job import main_job_rows, section_main_job
from results.benchkit.meta import given_commit, section_meta
from results.benchkit.op import op_rows, section_op
from results.benchkit.order import LATER, in_stage
from results.benchkit.part import Part, Section, now_iso, row_key, write_results
from results.benchkit.settings import check_settings, chosen_sections, quick_defaults, section_limits
from results.benchkit.train_step import section_train, train_rows

REPORT_SCHEMA = reportfile.SCHEMA
def no_rows(cfg, cuda):
    return []


def gpu_check_rows(cfg, cuda, mode):
    return [dict(mode=mode)]  # (the plan's one unit: kernels/gpu_check.py, whose rows come as it writes them)


def train_section(variants, later=(), stand_in=False):
    """(fn, rows) of a training section: section_train and train_rows bound to its variants."""
    return (partial(section_train, variants=variants, later=later, stand_in=stand_in),
            partial(train_rows, variants=variants, later=later))


# the report's sections, run in this order (its priorities)
SECTIONS = {
    "meta": Section(60, "device, driver, CUDA, torch, Triton, cuDNN, git commit, date", section_meta, no_rows),
    "gpu_check_accuracy": Section(150, "python -m kernels.gpu_check accuracy: Triton vs float64, beside model.py's "
                                       "error", partial(section_gpu_check, mode="accuracy"),
                                  partial(gpu_check_rows, mode="accuracy")),
    "gpu_check_determinism": Section(60, "python -m kernels.gpu_check determinism: two fwd+bwd runs bit for bit",
                                     partial(section_gpu_check, mode="determinism"),
                                     partial(gpu_check_rows, mode="determinism")),
    "op": Section(300, "the TSSA operator fwd+bwd vs SDPA (FlashAttention-2 and cuDNN forced), GPU time, launches",
                  section_op, op_rows),
    "decode": Section(420, "per-token decoding 1K..64K: ToST (torch, triton) and GPT-2 (static KV cache), eager, "
                           "CUDA graph, compiled + CUDA graph", section_decode, decode_rows),
    "train_tost": Section(420, "ToST-Base training step (compiled, tssa_impl=torch) at 4K..64K",
                          *train_section([("tost", "torch", None)])),
    "train_gpt2_flash": Section(420, "GPT-2 Base training step (compiled, SDPA forced to FlashAttention-2) at 4K..64K",
                                *train_section([("gpt2", None, "flash")], stand_in=True)),
    "train_gpt2_cudnn": Section(420, "GPT-2 Base training step (compiled, SDPA forced to cuDNN attention) at 4K..64K",
                                *train_section([("gpt2", None, "cudnn")])),
    "main_job": Section(600, "200 iterations of config/tost_owt.py, then of config/gpt2_owt.py (synthetic GPT-2 "
                             "tokens): tokens/s, MFU, a profile of each micro-step", section_main_job, main_job_rows),
    "train_tost_triton": Section(420, "ToST-Base training step (compiled, tssa_impl=triton) at 4K..64K",
                                 *train_section([("tost", "triton", None)])),
}
DONE = ("ok", "skipped", "failed")  # a section in one of these states is not run again unless named
POLL_S = 0.5  # how often the parent looks for new rows of the section in flight


# -----------------------------------------------------------------------------
# one section in its own process


def hang_after(name):
    """The test hook NANOTOST_BENCH_HANG=<section>[:<rows>]: the number of rows after which that
    section hangs (0: before it starts), or None."""
    section, _, rows = os.environ.get("NANOTOST_BENCH_HANG", "").partition(":")
    return (int(rows) if rows else 0) if section == name else None


def run_section(name, fn, cfg, path, limit_s, hang=None, previous=None, command_pid=None):
    """The body of one section's process: its own process group (the parent ends the whole group
    at the limit, children such as train.py included, and the group's keeper ends it when the
    command or the section is gone: results/benchkit/keeper.py), then the section, then the part's status."""
    portable.lead_group()
    keeper.start(command_pid or os.getppid())
    cfg.device, cfg.dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as train.py
    S = Part(name, path, cfg, limit_s, (previous or {}).get("rows", ()), hang)
    S.previous_started = (previous or {}).get("started")
    try:
        S.hang_here()
        fn(S)
        rows = S.data["rows"]
        whole = rows and all(r["status"] == "skipped" for r in rows)
        later = [r for r in rows if r["status"] == "not_run" and r.get("reason") == LATER]
        cut = [r for r in rows if r["status"] == "not_run" and r not in later]
        if cut:
            S.finish("timed_out", reason=f"its time limit came before {len(cut)} of {len(rows)} rows")
        elif later:
            S.finish("partial", reason=f"{len(later)} of {len(rows)} rows are {LATER}")
        else:
            S.finish("skipped" if whole else "ok", **({"reason": rows[0]["reason"]} if whole else {}))
    except BaseException as e:
        import traceback
        S.finish("failed", reason=f"{type(e).__name__}: {str(e).strip()[:300]}",
                 traceback=traceback.format_exc()[-3000:])
        raise SystemExit(1) from None
    finally:
        keep_compiles(cfg, f"{path}.{getattr(cfg, 'stage', None) or 'all'}")


def keep_compiles(cfg, base):
    """This process's compiles, kept for the next window (results/benchkit/compile_cache.py): never the
    section's failure."""
    if getattr(cfg, "keep_compiles", False):
        try:
            compile_cache.save_here(base + compile_cache.PART)
        except Exception as e:  # noqa: BLE001 (a cache is a saving of time, nothing more)
            print(f"  (the compile cache was not kept: {type(e).__name__}: {str(e)[:200]})", flush=True)


def _read_new(path, seen):
    """The part file at path if it changed since `seen` (its (mtime, size)): (part or None, seen)."""
    try:
        st = os.stat(path)
    except OSError:
        return None, seen
    now = (st.st_mtime_ns, st.st_size)
    if now == seen:
        return None, seen
    return atomic.read_json(path, "a bug: the section's process wrote it"), now


@contextlib.contextmanager
def section_env(cfg):
    """The environment a section's process starts with (that of the server the sections are
    forked from, which the first section starts): the repository importable from any folder
    (the server preloads benchkit), and with C.triton_interpret (the headline's rehearsal)
    TRITON_INTERPRET=1, which Triton reads when it is first imported. This process's
    environment is as it was after."""
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", "TRITON_INTERPRET")}
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + ([before["PYTHONPATH"]] if before["PYTHONPATH"] else []))
    if getattr(cfg, "triton_interpret", False):
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_child(ctx, name, fn, cfg, tmp, limit_s, previous=None, on_rows=None):
    """Run one section in its own process with a time limit (previous: a part whose measured rows
    it keeps); on_rows(part) gets its part each time a row was written. Returns its part: its
    rows, and its status (ok, skipped, failed, timed_out, interrupted), wall time and limit."""
    path = os.path.join(tmp, f"{name}.json")
    p = ctx.Process(target=run_section, args=(name, fn, cfg, path, limit_s, hang_after(name), previous, os.getpid()),
                    daemon=False)
    t0, interrupted, seen = time.time(), False, None
    try:
        with section_env(cfg):
            p.start()  # (the first also starts the server the sections are forked from: not the section's time)
        t0 = time.time()
        while p.is_alive() and time.time() - t0 < limit_s:
            p.join(max(0.0, min(POLL_S, limit_s - (time.time() - t0))))
            part, seen = _read_new(path, seen)
            if part is not None and on_rows is not None and p.is_alive():
                on_rows(dict(part, limit_s=limit_s))
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) reaches this process only: the section has its own group
        interrupted = True
    timed_out = p.is_alive() and not interrupted
    if p.pid is not None and p.is_alive():  # its whole process group: train.py, gpu_check, compile workers too
        for force in (False, True):
            try:
                portable.signal_group(p.pid, force)
            except (ProcessLookupError, PermissionError):  # (no group: it had not led one yet)
                if p.is_alive():
                    p.kill()
            p.join(5)
    part = dict(section=name, status="failed", rows=[])
    if os.path.isfile(path):  # written whole by the section (atomic_write): its rows so far
        part = atomic.read_json(path, "a bug: the section's process wrote it")
    part.update(wall_s=round(time.time() - t0, 1), limit_s=limit_s)
    if interrupted:
        part.update(status="interrupted", reason="interrupted (Ctrl-C or SIGTERM); the rows measured before are "
                                                 "kept, and the command printed measures the rest")
    elif timed_out:
        part.update(status="timed_out", reason=f"stopped at its time limit of {limit_s:.0f} s; the rows "
                                               f"measured before are kept")
    elif part.get("status") in ("running", "failed") and p.exitcode != 0 and not part.get("reason"):
        part.update(status="failed", reason=f"its process ended with exit code {p.exitcode}")
    return part


# -----------------------------------------------------------------------------
# the report's JSON


def report_out(cfg, meta):
    """The merged JSON's path: --out, else under the ignored out-bench/: <gpu>.json for a full
    CUDA report or headline, <gpu>-quick.json / <gpu>-headline-quick.json, cpu-report.json /
    cpu-headline.json otherwise; an --out ending in / is the folder for that name. The committed
    results/<gpu>.json is written only when named (--out=results/): no run replaces it by default."""
    headline = meta.get("plan") == "headline"
    if not meta["gpu"]:
        name = "cpu-headline" if headline else "cpu-report"
    else:
        name = meta["slug"] + ("-headline-quick" if headline and cfg.quick else "-quick" if cfg.quick else "")
    if cfg.out == "auto" or cfg.out.endswith(("/", os.sep)):
        return os.path.join("out-bench" if cfg.out == "auto" else cfg.out, f"{name}.json")
    return cfg.out


def load_report(path, meta):
    """The report already at path (to continue), or a new one; one of another device or kind
    (quick or full), or a headline's where a report would continue, is refused."""
    if not os.path.isfile(path):
        return dict(schema=REPORT_SCHEMA, meta=meta, runs=[], sections={})
    old = read_report(path, say=True)
    old_meta = old["meta"]
    if (old_meta.get("slug"), bool(old_meta.get("quick"))) != (meta["slug"], bool(meta["quick"])):
        raise cli.UserError(f"{path} holds a {'quick ' if old_meta.get('quick') else ''}report of "
                            f"{old_meta.get('name')!r}, not of this {'quick ' if meta['quick'] else ''}run on "
                            f"{meta['name']!r}: choose another --out")
    if old_meta.get("plan") == "headline" and meta.get("plan", "report") == "report":
        raise cli.UserError(f"{path} holds the figures of bench.py --headline, which --report does not continue: "
                            "choose another --out, or run --headline")
    return old


def read_report(path, say=False):
    """The report at path, read as the renderer reads it (results/benchkit/reportfile.py: its fields
    checked, one line naming the file and the field), except that a row holding a NaN or
    infinite figure is no measurement: it is replaced by a row saying so (measured again), and
    with `say`, one line says so."""
    data, refused = reportfile.read_report(path, "restore it (git checkout, or a copy), or choose another --out")
    for field, _, value in refused if say else ():
        print(f"{path}: {field} is {json.dumps(value)}, not a finite number: refused, and that row is measured again",
              flush=True)
    return data


def is_current(part, meta):
    """Whether a section's part was measured by this code (source_sha256) on this device (a part
    without a device is of the report's own, which load_report checked)."""
    return bool(part) and part.get("source_sha256") == meta["source_sha256"] and \
        part.get("device", meta["slug"]) == meta["slug"]


def is_done(part, meta):
    """A section that a new run (sections=all) does not repeat: measured by this code on this
    device, and done, or timed out at its own limit (not cut short by budget_s)."""
    if not is_current(part, meta):
        return False
    return part.get("status") in DONE or (part.get("status") == "timed_out" and not part.get("cut_by_budget"))


def rows_to_keep(cfg, old, meta):
    """The earlier part of a section about to run again whose measured rows it keeps: those
    measured by the same code on the same device, unless --remeasure. Only the missing rows (not
    run before a limit, or never tried) are measured; a cut section thus continues where it stopped."""
    if cfg.remeasure or not is_current(old, meta):
        return None
    return old


def retire(merged, name, why):
    """Section `name` of the report is no longer current: its part goes to the JSON's history
    (a part with no rows is not history), a not_run placeholder saying why takes its place."""
    old = merged["sections"].get(name)
    if old and old.get("rows"):
        merged.setdefault("history", []).append(dict(old, section=name, retired=now_iso(), retired_because=why))
    merged["sections"][name] = dict(section=name, status="not_run", rows=[], reason=why)


# -----------------------------------------------------------------------------
# the runner


def with_kept(part, previous):
    """The part, with the rows of `previous` (an earlier part whose measured rows it keeps) that
    it has not reached yet: a section stopped before them does not lose them. They are marked
    kept_from the earlier part's start (an earlier stage of the same command has none)."""
    if not previous:
        return part
    have = {row_key(r) for r in part.get("rows", [])}
    since = previous.get("started")
    kept = [dict(r, **({"kept_from": r.get("kept_from") or since} if r.get("kept_from") or since else {}))
            for r in previous.get("rows", []) if r.get("status") not in ("not_run", "running")
            and row_key(r) not in have]
    return dict(part, rows=part.get("rows", []) + kept) if kept else part


def stamped(part, meta, **info):
    """A part as the report keeps it: with the commit, code and device that measured it."""
    return dict(part, **info, commit=meta["commit"], source_sha256=meta["source_sha256"], device=meta["slug"])


def execute(cfg, sections, stages, schedule, fresh, keep_done, saved=None):
    """Run `stages` ([(name, stage)]: a section of `sections`, {name: Section}, whole (stage None)
    or the rows of one stage of the headline's order, results/benchkit/order.py) into one JSON, meta
    always, first; each row into the JSON as it is measured, each starting only when its
    estimated cost (results/benchkit/costs.py: this run's rows, then earlier reports of the device) fits
    in what is left. schedule(name, stage, t_start, estimates, spent) -> (limit_s, cut_by_budget),
    or a reason (a string) where the stage cannot start (estimates: {row_key: seconds} of its rows
    to measure; spent: the seconds each section took so far). fresh: the JSON's earlier sections
    all go to history (a fresh headline); else those measured by other code or elsewhere do.
    keep_done: a section already done (is_done) is not run again (--report with sections=all).
    saved(merged, out): what an interrupt leaves behind, said (default: the same command goes
    on). Returns the report, its path, this call's record in its runs, and the meta part."""
    # checks the device; no CUDA here (the sections')
    cfg.device, _ = devices.choose_device_dtype(cfg.device, "float32")
    cuda = cfg.device.startswith("cuda")
    if "forkserver" in multiprocessing.get_all_start_methods():  # (Linux, macOS; Windows spawns each section)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["results.benchkit.report", "results.benchkit.headline"])
    else:
        ctx = multiprocessing.get_context("spawn")
    t_start = time.time()
    tmp = report_temp()
    try:
        meta_part = run_child(ctx, "meta", sections["meta"].fn, cfg, tmp, schedule("meta", None, t_start, {}, {})[0])
        if meta_part["status"] == "interrupted":
            raise KeyboardInterrupt
        meta = meta_part.get("meta")
        if meta_part["status"] != "ok" or not meta:
            raise cli.UserError(f"the meta section {meta_part['status']}: {meta_part.get('reason', '')}")
        if getattr(cfg, "triton_interpret", False) and not meta["triton_interpret"]:
            # this process's server of sections started earlier without the interpreter: a fresh
            # interpreter for each section instead (spawned, TRITON_INTERPRET=1 from the start)
            ctx = multiprocessing.get_context("spawn")
        out = report_out(cfg, meta)
        outputs.claim_output(out, "--out=<another file>")  # one report at a time into one file
        merged = load_report(out, meta)
        for name in [n for n in merged["sections"] if n != "meta"]:
            part = merged["sections"][name]
            if fresh:
                retire(merged, name, "a fresh run (--headline): the earlier measurement is in the JSON's history")
            elif name not in sections:
                retire(merged, name, f"not a section of --{meta['plan']}: moved to the JSON's history")
            elif part.get("status") != "not_run" and not is_current(part, meta):
                retire(merged, name, f"measured by other code or on another device (source_sha256 "
                                     f"{part.get('source_sha256')}, commit {str(part.get('commit'))[:10]}): moved "
                                     "to the JSON's history; the same command measures it again")
        if fresh:
            merged["sections"] = {}
        merged["meta"] = meta
        merged["sections"]["meta"] = stamped(meta_part, meta)
        run = dict(started=meta["date"], commit=meta["commit"], source_sha256=meta["source_sha256"],
                   argv=cfg.argv, sections=[])
        merged["runs"].append(run)
        sources = plan.cost_sources(meta, out)
        load_from, save_to = compile_cache.files(cfg, out, meta["slug"], cuda)
        cfg.keep_compiles = save_to is not None
        run["compile_cache"] = compile_cache.load(load_from) if save_to else dict(
            loaded=False, why="compile_cache=off" if cuda else "none on the CPU (the rows that compile run on CUDA)")
        write_results(out, merged)  # a valid report from the start
        print(f"{meta['plan']} on {meta['name']} ({cfg.device}, {meta['dtype']}), torch {meta['torch']}, code "
              f"{meta['source_sha256']}, commit {(meta['commit'] or 'none')[:10]} ({meta['commit_check']}): {out}",
              flush=True)
        print(f"estimates: this run's rows, then {out}'s" + "".join(f", then {label}" for label, _ in sources)
              + f"; compile cache: {describe_cache(run['compile_cache'])}", flush=True)

        def say():
            return saved(merged, out) if saved else f"{out} holds every row measured so far; the same command runs " \
                                                    "what is missing"
        ran, spent = [], {}
        for name, stage in stages:
            old = merged["sections"].get(name)
            if keep_done and is_done(old, meta):
                print(f"[{name}] kept from {out} ({old['status']}, run {old.get('started', '?')}); name it in "
                      f"--sections to run it again", flush=True)
                continue
            again = name in ran  # a later stage of a section this command has run: its rows kept as they are
            previous = dict(old, started=None) if again else None if fresh else rows_to_keep(cfg, old, meta)
            measured = {row_key(r) for r in (previous or {}).get("rows", []) if r.get("status") not in
                        ("not_run", "running")}
            keys = [k for k in sections[name].rows(cfg, cuda) if in_stage(name, k, stage)]
            todo = [k for k in keys if row_key(k) not in measured]
            if stage is not None and keys and not todo:
                continue  # (every row of this stage is kept from an earlier command)
            estimates = plan.estimates_for(cfg, Costs(cfg, [("this run", merged)] + sources), name, todo)
            slot = schedule(name, stage, t_start, estimates, spent)
            if isinstance(slot, str):
                if again:
                    pass  # (its rows wait as they are: finish_waiting says why at the end)
                elif not is_current(old, meta) or old.get("status") == "not_run":
                    merged["sections"][name] = dict(section=name, status="not_run", rows=[], reason=slot)
                print(f"[{name}{': ' + stage + ' rows' if stage else ''}] not run: {slot}", flush=True)
                continue
            limit, cut = slot
            cfg.stage, cfg.estimates = stage, estimates
            ran += [] if again else [name]
            run["sections"] = ran
            print(f"[{name}{': ' + stage + ' rows' if stage else ''}] {sections[name].what} (limit {limit:.0f} s)",
                  flush=True)

            def publish(part, name=name, previous=previous):  # each row into the report as it is measured
                merged["sections"][name] = stamped(with_kept(part, previous), meta)
                write_results(out, merged, saved=say())
            part = with_kept(run_child(ctx, name, sections[name].fn, cfg, tmp, limit, previous, publish), previous)
            merged["sections"][name] = stamped(part, meta, cut_by_budget=cut)
            spent[name] = spent.get(name, 0.0) + part["wall_s"]
            counts = {}
            for r in part.get("rows", []):
                counts[r["status"]] = counts.get(r["status"], 0) + 1
            print(f"[{name}] {part['status']} in {part['wall_s']:.0f} s: " + (", ".join(
                f"{n} {s}" for s, n in counts.items()) or "no rows") + (f" ({part['reason']})" if part.get("reason")
                                                                       else ""), flush=True)
            if save_to:
                members = compile_cache.gather(tmp, load_from, save_to)
                run["compile_cache"]["saved"] = dict(file=save_to, members=members)
            write_results(out, merged, saved=say())
            if part["status"] == "interrupted":
                raise KeyboardInterrupt
        for name in sections:
            merged["sections"].setdefault(name, dict(section=name, status="not_run", rows=[],
                                                     reason="not in this run's --sections"))
            if name in ran:  # (a section this command ran whose later stage did not come)
                finish_waiting(merged["sections"][name], cfg)
        merged["sections"] = {n: merged["sections"][n] for n in sections}  # (in the plan's order)
        run["compiles"] = plan.compile_record(merged, ran, sources)
        run["finished"] = now_iso()
        write_results(out, merged)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return merged, out, run, meta_part


TEMP_PREFIX = "nanotost-report-"  # the report's temporary folder in the temp dir: <prefix><pid>


def report_temp():
    """This run's temporary folder (its sections' parts, compile artifacts), named by its pid in the
    temp dir: what a killed run (-9, a device's time limit) left there is removed first."""
    root = tempfile.gettempdir()
    atomic.remove_dead_temps(root, TEMP_PREFIX)
    path = os.path.join(root, f"{TEMP_PREFIX}{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)  # (this process's own, from a call that did not end)
    os.makedirs(path)
    return path


def describe_cache(info):
    """The compile cache a run loaded, in words."""
    if not info.get("loaded"):
        return info.get("why", "none") + (f" ({info['file']})" if info.get("file") else "")
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(info.get("artifacts", {}).items())) or "no artifacts"
    return f"{info['members']} parts of {info['file']} loaded in {info['load_s']:.1f} s ({kinds})"


def finish_waiting(part, cfg):
    """A section whose rows wait for a later stage that never came (budget_s spent first): those
    rows say so, and the section timed out, cut by the budget (the next command measures them)."""
    waiting = [r for r in part.get("rows", []) if r.get("status") == "not_run" and r.get("reason") == LATER]
    if not waiting:
        return
    for r in waiting:
        r["reason"] = (f"budget_s={cfg.budget_s:g} was spent before its stage (rows of less value come after the "
                       "targets)")
    part.update(status="timed_out", cut_by_budget=True,
                reason=f"budget_s={cfg.budget_s:g} was spent before {len(waiting)} of {len(part['rows'])} rows")


def show_tables(out):
    """results/render.py's GPU tables of the report at out, printed (a failure to render says so)."""
    shown = subprocess.run([sys.executable, os.path.join(REPO, "results", "render.py"), "--show=gpu_*",
                            f"--json_path={out}"], capture_output=True, text=True)
    print(shown.stdout + (f"(results/render.py failed: {shown.stderr.strip()[-500:]})" if shown.returncode else ""))


def check_out(cfg):
    """An --out that names a file: claimed, and a damaged report there said, before the sections run."""
    if cfg.out != "auto" and not cfg.out.endswith(("/", os.sep)):
        outputs.claim_output(cfg.out, "--out=<another file>")
        if os.path.isfile(cfg.out):
            read_report(cfg.out)


def run(cfg, given):
    """--report: every setting checked, then the sections (this module's docstring)."""
    quick_defaults(cfg, given)
    check_settings(cfg, SECTIONS, given)
    given_commit()  # NANOTOST_COMMIT's form, before any work (meta records it)
    check_out(cfg)
    chosen = chosen_sections(cfg, SECTIONS)
    limits = section_limits(cfg, SECTIONS)

    def schedule(name, stage, t_start, estimates, spent):  # its own limit, cut to what budget_s leaves (10 s
        left = cfg.budget_s - (time.time() - t_start) - 10 if cfg.budget_s else float("inf")  # kept for the writes)
        if name != "meta" and left < min(limits[name], 60.0):
            return f"budget_s={cfg.budget_s:g} was spent before it could start; run the command again"
        return min(limits[name], max(left, 1.0)), left < limits[name]
    stages = [(name, None) for name in SECTIONS if name in chosen and name != "meta"]
    merged, out, run_, meta_part = execute(cfg, SECTIONS, stages, schedule, fresh=False,
                                           keep_done=cfg.sections == "all")
    if cfg.budget_s and not run_["sections"] and any(n in chosen and merged["sections"][n]["status"] == "not_run"
                                                   for n in SECTIONS):
        raise cli.UserError(f"budget_s={cfg.budget_s:g} was spent before any section could start (meta took "
                            f"{meta_part['wall_s']:.0f} s): give a larger --budget_s, or 0 for no limit")
    meta = merged["meta"]
    missing = [n for n in SECTIONS if not is_done(merged["sections"][n], meta)]
    stopped = [n for n in SECTIONS if merged["sections"][n]["status"] in ("timed_out", "failed") and n not in missing]
    print(f"\nwrote {out}", flush=True)
    show_tables(out)
    print("sections: " + ", ".join(f"{n} {merged['sections'][n]['status']}" for n in SECTIONS))
    if missing:
        print(f"not complete: {', '.join(missing)}: the same command runs what is missing and keeps the rest")
    if stopped:
        print(f"timed out or failed: {', '.join(stopped)} (kept as they are; name them in --sections to run their "
              f"missing rows)")
    return merged
