"""
results/benchkit/order.py: the headline's order of value, row by row. The rows the targets are stated
in come first (TARGET): the GPU correctness check; the operator's `triton` and SDPA rows at
B1 T16K, B16 T1K, B1 T64K (today's kernels and the re-tiled ones) and each Triton launch's time;
the main job with `triton` named, then with its step replayed as CUDA graphs
(compile_mode=reduce-overhead), then GPT-2's; the training pairs, GPT-2 + cuDNN and ToST with
`triton` named, 4K then 16K then 64K; decoding (ToST `triton` and GPT-2) at 1K and 64K. Then
the rest (EXTRA): auto's rows, the reference's rows (compiled and eager), the decoding step
compiled with Inductor's autotuning (minutes of compile) and anything else.

The headline runs its sections in STAGES: a section may run twice, once for its target rows and
once for the rest, so that no row of the rest runs before a target row of another section. A
row outside its section's stage is left for the later stage (results/benchkit/part.py). Standard
library only: the plan (results/benchkit/plan.py) and the sections' processes read it alike.
"""

TARGET, EXTRA = "target", "extra"
# (section, stage) in the order the headline runs them; meta, first, has no stage
STAGES = (("gpu_check_accuracy", TARGET), ("op", TARGET), ("kernel_times", TARGET), ("main_job", TARGET),
          ("train", TARGET), ("decode", TARGET),
          ("train", EXTRA), ("main_job", EXTRA), ("op", EXTRA), ("decode", EXTRA))
LATER = "left for a later stage of the headline (rows of less value)"  # a row's reason while it waits


def tier(section, key):
    """TARGET or EXTRA: where the row `key` (its identifying fields) of `section` stands."""
    impl, arch = key.get("impl"), key.get("arch")
    if section == "op":  # the reference (compiled, eager) is the rest; triton, SDPA, a CPU's own kernels lead
        return EXTRA if impl in ("compiled", "torch") else TARGET
    if section == "train":  # GPT-2 (cuDNN, or a CPU's stand-in) and ToST with triton named
        return TARGET if arch == "gpt2" or impl == "triton" else EXTRA
    if section == "decode":  # ToST's reference step and the autotuned compiles are the rest
        return EXTRA if (arch == "tost" and impl == "torch") or key.get("mode") == "autotuned" else TARGET
    if section == "main_job":
        return TARGET if arch == "gpt2" or impl == "triton" else EXTRA
    return TARGET  # gpu_check_accuracy, kernel_times: whole


def in_stage(section, key, stage):
    """Whether the row belongs to `stage` (None: every row, as --report runs a section)."""
    return stage is None or tier(section, key) == stage


def stages_of(chosen):
    """The (section, stage) pairs of the chosen sections, in the order of value; a section whose
    rows are all of one tier runs once."""
    return [(name, stage) for name, stage in STAGES if name in chosen]
