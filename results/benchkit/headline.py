"""
results/benchkit/headline.py: bench.py --headline, the figures a GPU session exists for, in one command
under one deadline (--budget_s, 540 s by default: a 10-minute command with a minute to spare),
row by row in order of value (results/benchkit/order.py), so that a run cut short keeps the most valuable:

    meta             the device, the versions, the code (source_sha256) and its commit
    gpu_check_accuracy   the Triton kernels against float64 (kernels/gpu_check.py)
    op               the operator fwd+bwd at B1 T16K, B16 T1K, B1 T64K: triton and SDPA (flash, cuDNN)
    kernel_times     each Triton launch's GPU time and TB/s beside launch_plan()'s model
    train            the training step at 4K, 16K, 64K: GPT-2 + cuDNN and ToST (triton), length by length
    decode           a token after 1K and 64K of context, ToST (triton) and GPT-2, CUDA graph and compiled
    main_job         train.py config/tost_owt.py with triton, then GPT-2's, 60 iterations (the report: 200)
    then the rest    auto's rows (train, main job), the reference's (op compiled and eager, decode torch)

Each row starts only when its own estimated cost fits in what is left of the deadline
(results/benchkit/costs.py: from the rows this run measured, the report at --out, results/<gpu>.json;
`--plan_from=<report>` prints the plan without measuring). A section runs in its own process
(results/benchkit/report.py), once for its target rows and once for the rest; --section_s caps a section.
A headline is a fresh report in --out (a folder ending in /: <gpu>.json in it): whatever the file
held goes to its history, and every row is written into it the moment it is measured. The
sections it could not finish, cut by the deadline, by Ctrl-C or by SIGTERM, are printed as the
next command, which measures only what is missing (keeping the rows this code measured on this
device). torch.compile's artifacts are kept beside the report for the next window
(results/benchkit/compile_cache.py). On the CPU, `--headline --device=cpu --quick` rehearses every
section's code path at the tiniest shapes, the Triton rows interpreted (TRITON_INTERPRET=1).
"""

import time
from functools import partial

from results.benchkit import plan, report
from results.benchkit.decode import decode_rows, section_decode
from results.benchkit.gpu_check import section_gpu_check
from results.benchkit.kernel_times import kernel_times_rows, section_kernel_times
from results.benchkit.main_job import main_job_rows, section_main_job
from results.benchkit.meta import given_commit, section_meta
from results.benchkit.op import op_rows, section_op
from results.benchkit.order import stages_of
from results.benchkit.part import Section
from results.benchkit.settings import SECTION_START_S, check_settings, chosen_sections, quick_defaults, row_reserve_s, \
    section_limits

BUDGET_S = 540  # the default deadline of the whole command
NO_CAP = float("inf")  # a section's own limit: none but the deadline (--section_s gives one)
MARGIN_S = plan.MARGIN_S  # of the deadline, kept for the end of the command: the writes and the tables
# the settings the headline measures at (where not given): the targets' shapes, a shorter main job
SETTINGS = dict(T="16384,65536", model_T="4096,16384,65536", decode_T="1024,65536", main_iters=60)
TRAIN = dict(variants=[("gpt2", None, "cudnn"), ("tost", "triton", None)], later=[("tost", "auto", None)])
DECODE_MODES = ("captured", "compiled", "autotuned")  # (autotuned: after every target row, order.tier)
# name: (its limit in seconds, meta's own; the others: none but the deadline, or --section_s), what, fn, rows
HEADLINE = {
    "meta": Section(20, "device, driver, CUDA, torch, Triton, cuDNN, the code's digest and commit", section_meta,
                    report.no_rows),
    "gpu_check_accuracy": Section(NO_CAP, "python -m kernels.gpu_check accuracy: Triton vs float64, beside "
                                            "model.py's error", partial(section_gpu_check, mode="accuracy"),
                                  partial(report.gpu_check_rows, mode="accuracy")),
    "op": Section(NO_CAP, "the operator fwd+bwd at B1 T16K, B16 T1K, B1 T64K: triton (today's kernels and the "
                            "re-tiled), SDPA flash and cuDNN, then the reference compiled and eager", section_op,
                  op_rows),
    "kernel_times": Section(NO_CAP, "each Triton launch: GPU time and TB/s against kernels.triton_tssa."
                                      "launch_plan()", section_kernel_times, kernel_times_rows),
    "train": Section(NO_CAP, "the training step at 4K, 16K, 64K: GPT-2 + cuDNN and ToST (triton), then ToST "
                               "(tssa_impl=auto)", *report.train_section(**TRAIN, stand_in=True)),
    "decode": Section(NO_CAP, "a token after 1K and 64K: ToST (triton, then torch) and GPT-2, CUDA graph and "
                                "compiled, then compiled with Inductor's autotuning",
                      partial(section_decode, modes=DECODE_MODES), partial(decode_rows, modes=DECODE_MODES)),
    "main_job": Section(NO_CAP, "main_iters iterations of config/tost_owt.py (triton, then its step as CUDA graphs, "
                                  "then main_tssa_impl) and of config/gpt2_owt.py (synthetic tokens): tokens/s, MFU",
                        section_main_job, main_job_rows),
}


def undone(merged, chosen):
    """The chosen sections (meta aside) with a row still to measure: not run, cut, interrupted,
    waiting for a later stage."""
    return [n for n in HEADLINE if n != "meta" and n in chosen and (merged["sections"].get(n) or {}).get("status")
            not in ("ok", "skipped")]


def next_command(cfg, meta, missing):
    """The command that measures what is missing, `missing` sections (it keeps the rows of the
    JSON at --out that this code measured on this device): this command's settings, less those
    that would measure everything again, with the commit where it is the code measured."""
    commit = f"NANOTOST_COMMIT={meta['commit']} " if meta.get("commit_from") == "NANOTOST_COMMIT" else ""
    kept = [a for a in cfg.argv if not a.startswith(("--sections=", "--headline", "--remeasure"))]
    return commit + "python bench.py --headline " + f"--sections={','.join(missing)} " + " ".join(kept)


def run(cfg, given):
    """--headline: every setting checked, then the rows in order of value (this module's docstring)."""
    for key, value in dict(SETTINGS, budget_s=BUDGET_S).items():
        if key not in given:
            setattr(cfg, key, value)
    quick_defaults(cfg, given)
    check_settings(cfg, HEADLINE, given)
    if cfg.plan_from:
        return plan.show(cfg, HEADLINE)
    given_commit()  # NANOTOST_COMMIT's form, before any work (meta records it)
    report.check_out(cfg)
    limits = section_limits(cfg, HEADLINE)
    chosen = list(HEADLINE) if cfg.sections == "all" else ["meta"] + chosen_sections(cfg, HEADLINE)
    # the rehearsal: each section runs the Triton rows interpreted
    cfg.triton_interpret = cfg.quick and cfg.device == "cpu"
    reserve = row_reserve_s(cfg)

    def schedule(name, stage, t_start, estimates, spent):  # meta: its own limit; then what is left, if a row fits
        if name == "meta":
            return limits["meta"], False
        left, own = t_start + cfg.budget_s - MARGIN_S - time.time(), limits[name] - spent.get(name, 0.0)
        limit = min(left, own)
        rows = [s or 0.0 for k, s in estimates.items() if dict(k).get("mode") != "profile"]
        cheapest = min(rows, default=0.0)
        if not plan.fits(SECTION_START_S + reserve + cheapest, limit):
            spent_what = f"its --section_s limit was spent" if own < left else f"budget_s={cfg.budget_s:g} was spent"
            return (f"{spent_what} before it could start: {max(limit, 0):.0f} s left, its cheapest row needs about "
                    f"{cheapest:.0f} s")
        return limit, own > left

    def saved(merged, out):
        missing = undone(merged, chosen)
        return (f"{out} holds every row measured so far; this command measures what is missing: "
                f"{next_command(cfg, merged['meta'], missing)}") if missing else f"{out} holds every row"
    merged, out, run_, _ = report.execute(cfg, HEADLINE, stages_of(chosen), schedule, fresh=cfg.sections == "all",
                                          keep_done=False, saved=saved)
    print(f"\nwrote {out}", flush=True)
    report.show_tables(out)
    s = merged["sections"]
    print("sections: " + ", ".join(f"{n} {s[n]['status']}" for n in HEADLINE))
    compiles = run_["compiles"]
    before = compiles["before"]
    print(f"compiles: {compiles['seconds']:.0f} s in the {compiles['rows']} rows measured (compile cache: "
          f"{report.describe_cache(run_['compile_cache'])})" + (f"; the same rows in {before['source']}: "
                                                                 f"{before['seconds']:.0f} s over {before['rows']}"
                                                                 if before["source"] else ""), flush=True)
    missing = undone(merged, chosen)
    if missing:
        print(f"\nnot done: {', '.join(missing)}. The next command measures what is missing into the same JSON (keep "
              f"{out} where --out points; it keeps the rows this code measured on this device):\n"
              f"{next_command(cfg, merged['meta'], missing)}")
    else:
        print("\nevery section is done.")
    return merged
