"""
benchkit/headline.py: bench.py --headline, the figures a GPU session exists for, in one command
under one deadline (--budget_s, 540 s by default: a 10-minute command with a minute to spare),
in order of value, so that a run cut short keeps the most valuable ones:

    meta             the device, the versions, the code (source_sha256) and its commit
    gpu_check_accuracy   the Triton kernels against float64 (kernels/gpu_check.py)
    op               the operator fwd+bwd at B1 T16K, B16 T1K, B1 T64K: every implementation
    kernel_times     each Triton launch's GPU time and TB/s beside launch_plan()'s model
    train            the training step at 4K, 16K, 64K: ToST (tssa_impl=auto) and GPT-2 + cuDNN
                     length by length, then ToST with the Triton kernels forced
    decode           a token after 1K and 64K of context, as a CUDA graph and compiled
    main_job         train.py config/tost_owt.py (then GPT-2's) for 60 iterations (the report: 200)

meta has its own limit; each other section has a slot of the deadline (HEADLINE's shares, scaled
to what meta left of --budget_s): it must end by the end of its slot, and what an earlier section
leaves of its slot goes to the later ones.
A headline is a fresh report in --out (a folder ending in /: <gpu>.json in it): whatever the
file held goes to its history, and every row is written into it the moment it is measured. The
sections it could not finish are printed as the next command, which runs only them (keeping the
rows this code measured on this device). On the CPU, `--headline --device=cpu --quick` rehearses
every section's code path at the tiniest shapes, the Triton rows interpreted (TRITON_INTERPRET=1).
"""

import os
import time
from functools import partial

from benchkit import report
from benchkit.decode import section_decode
from benchkit.gpu_check import section_gpu_check
from benchkit.kernel_times import section_kernel_times
from benchkit.main_job import section_main_job
from benchkit.meta import given_commit, section_meta
from benchkit.op import section_op
from benchkit.part import Section
from benchkit.settings import check_settings, chosen_sections, quick_defaults, section_limits
from benchkit.train_step import section_train

BUDGET_S = 540  # the default deadline of the whole command
MARGIN_S = 25  # of the deadline, kept for the start of the section processes, the writes and the tables
# the settings the headline measures at (where not given): the targets' shapes, a shorter main job
SETTINGS = dict(T="16384,65536", model_T="4096,16384,65536", decode_T="1024,65536", main_iters=60)
# name: (its share of the deadline in seconds, what, fn); run in this order, by value. Measured on
# an H200 (report of 9b494a4): gpu_check accuracy 21 s; an operator shape with its 5 impls 8-10 s,
# compiles included; a compiled ToST-Base step row 10-20 s; the main job's 200 iterations 90 s
HEADLINE = {
    "meta": Section(20, "device, driver, CUDA, torch, Triton, cuDNN, the code's digest and commit", section_meta),
    "gpu_check_accuracy": Section(45, "python -m kernels.gpu_check accuracy: Triton vs float64, beside model.py's "
                                      "error", partial(section_gpu_check, mode="accuracy")),
    "op": Section(60, "the operator fwd+bwd at B1 T16K, B16 T1K, B1 T64K: triton, compiled and eager reference, "
                      "SDPA flash and cuDNN", section_op),
    "kernel_times": Section(35, "each Triton launch: GPU time and TB/s against kernels.triton_tssa.launch_plan()",
                            section_kernel_times),
    "train": Section(175, "the training step at 4K, 16K, 64K: ToST (tssa_impl=auto) vs GPT-2 + cuDNN, then ToST "
                          "(triton)", partial(section_train, variants=[("tost", "auto", None), ("gpt2", None, "cudnn")],
                                              later=[("tost", "triton", None)], stand_in=True)),
    "decode": Section(60, "a token after 1K and 64K: ToST (torch, triton) and GPT-2, CUDA graph and compiled",
                      partial(section_decode, modes=("captured", "compiled"))),
    "main_job": Section(120, "main_iters iterations of config/tost_owt.py, then of config/gpt2_owt.py (synthetic "
                             "tokens): tokens/s, MFU", section_main_job),
}


def slots(seconds, chosen, limits):
    """When each chosen section (meta aside) must end, in seconds from when meta ended: its share
    of the deadline and those of the sections before it, scaled so that they fill `seconds`."""
    names = [n for n in HEADLINE if n in chosen and n != "meta"]
    scale = seconds / sum(limits[n] for n in names)
    ends, total = {}, 0.0
    for n in names:
        total += scale * limits[n]
        ends[n] = total
    return ends


def next_command(C, undone):
    """The command that runs the sections left undone (and keeps the rest of the JSON at --out)."""
    commit = os.environ.get("NANOTOST_COMMIT")
    kept = [a for a in C.argv if not a.startswith(("--sections=", "--headline"))]
    return (f"NANOTOST_COMMIT={commit} " if commit else "") + "python bench.py --headline " + \
        f"--sections={','.join(undone)} " + " ".join(kept)


def run(C, given):
    """--headline: every setting checked, then the sections (this module's docstring)."""
    for key, value in dict(SETTINGS, budget_s=BUDGET_S).items():
        if key not in given:
            setattr(C, key, value)
    quick_defaults(C, given)
    check_settings(C, HEADLINE)
    given_commit()  # NANOTOST_COMMIT's form, before any work (meta records it)
    report.check_out(C)
    limits = section_limits(C, HEADLINE)
    chosen = list(HEADLINE) if C.sections == "all" else ["meta"] + chosen_sections(C, HEADLINE)
    C.triton_interpret = C.quick and C.device == "cpu"  # the rehearsal: each section runs the Triton rows interpreted

    slot = {}

    def schedule(name, t_start):  # meta: its own limit; then each section until the end of its slot
        if name == "meta":
            return limits["meta"], False
        if not slot:  # the shares, from now, scaled to what meta left of the deadline
            slot.update(t0=time.time(), ends=slots(C.budget_s - MARGIN_S - (time.time() - t_start), chosen, limits))
        left = slot["t0"] + slot["ends"][name] - time.time()
        return (left, False) if left >= 5.0 else None
    merged, out, _, _ = report.execute(C, HEADLINE, chosen, schedule, fresh=C.sections == "all", keep_done=False)
    print(f"\nwrote {out}", flush=True)
    report.show_tables(out)
    s = merged["sections"]
    print("sections: " + ", ".join(f"{n} {s[n]['status']}" for n in HEADLINE))
    undone = [n for n in HEADLINE if n != "meta" and s[n]["status"] not in ("ok", "skipped")]
    if undone:
        print(f"\nnot done: {', '.join(undone)}. The next command measures them into the same JSON (keep "
              f"{out} where --out points; it keeps the rows this code measured on this device):\n"
              f"{next_command(C, undone)}")
    else:
        print("\nevery section is done.")
    return merged
