"""
bench.py: speed and memory of TSSA (readable reference and fused fast paths) against softmax
attention through F.scaled_dot_product_attention, on CPU or CUDA. Its code is the package
results/benchkit/ (the report's runner, a module per section, the headline's plan, the timing helpers);
this file holds its settings and the choice of mode. `python -m bench` is the same command.

THE HEADLINE (--headline): the figures a GPU session is for, in one command under one deadline.
    python bench.py --headline --out=DIR/            # <= 540 s (--budget_s), into a fresh DIR/<gpu>.json
    python bench.py --headline --device=cpu --quick  # its rehearsal: every section's code path on the CPU
    python bench.py --headline --plan_from=results/nvidia-h200.json   # the plan its costs give: nothing measured
Rows, by value: meta, gpu_check_accuracy, op (triton and SDPA at B1 T16K, B16 T1K, B1 T64K),
kernel_times (each Triton launch against kernels.triton_tssa.launch_plan()), train (GPT-2 + cuDNN
and ToST triton at 4K, 16K, 64K), decode (1K, 64K), main_job (triton, then GPT-2's; 60
iterations), then auto's rows and the reference's. Each row starts when its own estimated cost
(from the device's earlier report) fits in what is left; what is missing is printed as the next
command; torch.compile's artifacts are kept for the next window. results/benchkit/headline.py says more.

THE REPORT (--report): one fixed protocol for a GPU, every section in full.
    python bench.py --report --out=results/          # every section, into the committed results/<gpu>.json
    python bench.py --report --budget_s=540          # what fits in 9 minutes (out-bench/); run again to continue
    python bench.py --report --sections=op,decode    # their missing rows (--remeasure=True: all again)
    python bench.py --report --device=cpu --quick    # a smoke run of every section (tiny shapes, seconds)
    python results/render.py                         # SPEED.md's GPU tables from the committed JSON
Sections (results/benchkit/report.py's SECTIONS; each in its own process under a time limit, --section_s
to change): meta, gpu_check_accuracy, gpu_check_determinism, op, decode, train_tost,
train_gpt2_flash, train_gpt2_cudnn, main_job, train_tost_triton. Every row goes into the JSON
(--out, a file or a folder ending in /; by default out-bench/) the moment it is measured; a
section that hangs is stopped at its limit with the rows it measured, and the next runs. A
section counts as done only when measured by this code (source_sha256) on this device: run
again with sections=all, the report measures the rest and moves what other code measured to
the JSON's history. Rows a device cannot run (Triton, FlashAttention, cuDNN, CUDA graphs,
torch.compile on the CPU) are rows saying why. One command writes a report file at a time;
Ctrl-C stops the section in flight and keeps the rest; a command killed outright (-9) leaves no
section running (results/benchkit/keeper.py); NANOTOST_COMMIT, when set, names the
commit measured (40 hex digits; checked against the code where the .git holds it).
SPEED.md says more.

THE SUITES (without --report): tables for any device and shape, JSON to bench_results.json.
    python bench.py --quick=1                        # a few minutes: operator + decode, T = 1K, 4K, 16K
    python bench.py                                  # everything this device can do, T = 1K .. 64K
    python bench.py --suites=op --impls=torch,cpu,sdpa --T=16384 --modes=fwdbwd --threads=2
    python bench.py --device=cuda --dtype=bfloat16 --suites=op,decode,model,model_decode
Suites (--suites, comma separated):
  op            the attention operator alone, (B, H, T, p) inputs: forward and forward+backward
  decode        one generated token at context T: TSSA recurrent step vs SDPA over a KV cache
  model         whole-model training step (forward, backward, AdamW): ToST-Base vs GPT-2 Base
  model_decode  whole-model per-token decoding at context T, with the size of the carried state
  vit           vision: 12 attention layers of ToST-S width, forward, at T tokens (image side 16 sqrt(T))
Implementations (--impls): the values of tssa_impl, each reached through kernels.ops_for /
kernels.use(model, impl) as a training run reaches it: torch (model.py's maths), cpu (the C
kernels), triton (the Triton kernels; CUDA); then sdpa (softmax attention; the backend that
ran is named: flash, cudnn, efficient or math) and compiled (torch.compile of model.py's
maths; off by default, it compiles for ~30 s). "auto": torch, the device's kernels, sdpa.
A fused implementation that fell back to the reference says so in the note column.
Times are medians of --repeats runs after --warmup runs; memory is the peak above what was
allocated before the case (CUDA allocator peak; on CPU the sampled growth of the resident set).
For TSSA rows, GB/s is the memory floor (bytes a perfect kernel must move: forward reads w and
writes out = 2 C values per token, forward+backward also reads w and dL/dout and writes dL/dw
= 5 C values per token; 10 C bytes in bf16) divided by the time, and "x floor" is the time over
the floor's time at the machine's measured copy bandwidth. A case whose estimated time exceeds
max_case_s is a row saying "skipped" (and the summary counts them).

Every setting is checked before anything runs (a mistake is one line, nothing written). A case
that raises is a row saying FAILED (and is counted in the summary); a run in which no case ran
exits with status 1, its rows still written. The JSON is written whole or not at all.
"""

import sys

from nanotost import cli
from results.benchkit import headline as headline_mode
from results.benchkit import report as report_mode
from results.benchkit import suites as suites_mode

# -----------------------------------------------------------------------------
# settings (override with a config file or --key=value)
device = "auto"  # "auto" (cuda if available) | "cpu" | "cuda" | "cuda:N"
dtype = "auto"  # "auto" (bfloat16 on cuda, float32 on cpu) | "float32" | "bfloat16" | "float16"
suites = "op,decode,model,model_decode"
impls = "auto"  # "auto" = torch,cpu,sdpa on cpu and torch,triton,sdpa on cuda; add "compiled" for torch.compile
modes = "fwd,fwdbwd"
T = "1024,2048,4096,8192,16384,32768,65536"  # sequence lengths / decode contexts (report: the operator's, at B)
model_T = "auto"  # whole-model lengths: "auto" = 1K..8K on cuda, 1K on cpu (report: 4K, 16K, 64K, 8K, 32K)
decode_T = "auto"  # whole-model decode contexts: "auto" = T on cuda, up to 16K on cpu (report: 1K, 64K, 4K, 16K, 32K)
B = 1
H = 12
p = 64
causal = True
threads = 0  # CPU threads (0: leave torch's default)
repeats = 5
warmup = 1
decode_steps = 50  # tokens per decode timing
max_case_s = 60.0  # skip a case whose estimated run time (from the previous T) is longer
quick = False  # a short run: suites: T = 1K, 4K, 16K, op and decode, 3 repeats; report, headline: the tiniest shapes
out = "auto"  # "auto": bench_results.json (suites); report, headline: out-bench/<gpu>.json, or a folder/ for it
# the report (--report) and the headline (--headline)
report = False  # run the report's sections (each its own process, time-limited) into one JSON
headline = False  # run the headline's sections under one deadline (budget_s) into a fresh JSON
sections = "all"  # the sections to run; report: "all" runs those not yet done (this code, this device)
section_s = ""  # time limits, seconds: "" each section's own, "300" every one, "op:200,decode:90"
budget_s = 0.0  # seconds for this whole command (report: 0 is no limit; headline: 540 unless given)
remeasure = False  # a section run again measures every row (False: keeps the rows this code measured here)
train_tokens = 65536  # tokens per training step (batch = train_tokens / T)
main_iters = 200  # iterations of the main job (headline: 60 unless given)
main_tssa_impl = "auto"  # the main job's tssa_impl (config/tost_owt.py's own: auto; the headline runs triton first)
plan_from = ""  # headline: a report's JSON: print the plan its costs give (rows, seconds, fits); measure nothing
compile_cache = "auto"  # report, headline: torch.compile's artifacts kept for the next run: "auto" | "off" | a .zip
# -----------------------------------------------------------------------------
DEFAULTS = cli.config_defaults(globals())  # the settings above


def main(argv):
    """The settings (a config file, then --key=value), then the mode they choose."""
    argv = [a + "=1" if a in ("--quick", "--report", "--headline") else a for a in argv]
    cfg, given = cli.configure(DEFAULTS, argv)
    cfg.argv = list(argv)
    if cfg.headline:
        return headline_mode.run(cfg, given)
    if cfg.report:
        return report_mode.run(cfg, given)
    return suites_mode.run(cfg, given)


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
