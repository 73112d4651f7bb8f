"""
tests/test_scripts_auto.py's background job: tssa_impl=auto in the scripts' own flows, with the Triton
kernels interpreted (TRITON_INTERPRET=1) and kernels.auto.CHECK_ON_CPU set, so that the check
and the pick run where the scripts ask for them: train.py's kernels.use(..., timed_at=...)
before its model is compiled (eager; and compiled, under bfloat16 autocast), then the same
command again with the first run's cache (read, not timed), sample.py's prefill and steps
(no_grad, eval mode), evaluate.py (a no_grad main; and --tssa_impl=cpu), lm_inspect.py (its
recorded forward), a model called under inference_mode and autocast, and a model whose first
call is inside torch.compile's trace. The timer is mocked (the Triton kernels "faster"): each
candidate still runs once at the call's shape, the compiled reference in this process or, inside
a trace, in its child process. Each flow has a cache folder of its own (as a fresh machine),
but "train again", which has train's. Writes what each flow picked, timed, said and warned as JSON.

    TRITON_INTERPRET=1 python tests/auto_in_scripts.py OUT.json
"""

import contextlib
import functools
import io
import json
import os
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import evaluate  # noqa: E402
import kernels  # noqa: E402
import lm_inspect  # noqa: E402
import model  # noqa: E402
import prepare_char  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from kernels import auto, fused, triton_tssa  # noqa: E402
from nanotost import cli  # noqa: E402

FAKE_TIMES = {"triton": 1e-3, "reference": 2e-3}  # the mocked timer: the Triton kernels are the faster
LAUNCHED = []  # (what, H, p) of the flow's calls of the Triton kernels (the check's: H=3, p=6; the models': H=2, p=16)
TIMING = [False]  # whether the calls now are the timing's (not counted)
CHILD_TIMES = []  # what the real child process measured, the first time
COUNTS = dict(timed=0, children=0, deciding_s=0.0)  # of the flow now: candidates timed, child processes, time in decide
SCRATCH = []  # the folder of the flows' caches


def fake_seconds(candidate, run, device, calls, rounds):
    COUNTS["timed"] += 1
    TIMING[0] = True
    try:
        run()  # the candidate runs at the call's shape (its errors show), once
    finally:
        TIMING[0] = False
    return FAKE_TIMES[candidate]


def fake_child(spec, real=auto.measure_in_child):
    COUNTS["children"] += 1
    if not CHILD_TIMES:  # the child process compiles and runs both candidates (their errors show), once
        CHILD_TIMES.append(real(spec))
    return dict(FAKE_TIMES)


def counted(kind, launch):
    def run(cls, w, *args, **kwargs):
        if not TIMING[0]:
            LAUNCHED.append((kind, w.shape[1], w.shape[-1]))
        return launch.__func__(cls, w, *args, **kwargs)
    return classmethod(run)


def timed_decide(*args, real=auto.decide):
    t0 = time.perf_counter()
    try:
        return real(*args)
    finally:
        COUNTS["deciding_s"] += time.perf_counter() - t0


def flow(name, fn, results, fresh=True, cache=None):
    """Run fn as a fresh process would (fresh: no answer kept from an earlier flow) with the cache
    folder `cache` (None: a new one) and record what auto picked, timed, printed and warned, and
    what fn returns (a dict of numbers, or None)."""
    if fresh:
        auto._REFUSALS.clear()
        auto._PICKS.clear()
    os.environ["NANOTOST_CACHE"] = cache or tempfile.mkdtemp(prefix="cache-", dir=SCRATCH[0])
    COUNTS.update(timed=0, children=0, deciding_s=0.0)
    out = io.StringIO()
    LAUNCHED.clear()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        try:
            numbers, error = fn(), None
        except SystemExit as e:
            numbers, error = None, f"exit {e.code}"
    picks = [(shape_class[0], compiled, triton) for (_, shape_class, compiled), triton in auto._PICKS.items()]
    said = [line for line in out.getvalue().splitlines() if line.startswith("tssa_impl=auto:")]
    results[name] = dict(error=error, numbers=numbers, refusals=dict(auto._REFUSALS), picks=picks, said=said,
                         failure=fused.failure_of("triton"), launched=sorted(set(LAUNCHED)),
                         warned=[str(w.message) for w in caught if "tssa_impl" in str(w.message)],
                         cache=os.environ["NANOTOST_CACHE"], **COUNTS)


def a_model_eager_and_compiled():
    """The loss of a model run by auto against model.py's (fp32 sums in another order), eager and
    compiled; the compiled graph whole (the choice a constant: no graph break)."""
    torch.manual_seed(0)
    cfg = model.GPTConfig(block_size=48, vocab_size=64, n_layer=1, n_head=2, n_embd=32)
    ref = model.GPT(cfg)
    picked = kernels.use(model.GPT(cfg), "auto")
    picked.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 64, (2, 40))
    loss, ref_loss = picked(idx, idx)[1].item(), ref(idx, idx)[1].item()
    breaks = torch._dynamo.explain(picked)(idx, idx).graph_break_count
    torch._dynamo.reset()
    compiled_loss = torch.compile(picked)(idx, idx)[1].item()
    return dict(loss=loss, reference_loss=ref_loss, compiled_loss=compiled_loss, graph_breaks=breaks)


def main(out_path):
    assert triton_tssa.INTERPRET, "TRITON_INTERPRET=1 was not seen at import"
    # the check's case at 43 tokens (3 chunks, a scan step each), p = 6 (two column blocks of 4)
    triton_tssa.BLOCK_T, triton_tssa.SCAN_CHUNKS, triton_tssa.FEATURE_BLOCK = 16, 1, 4
    auto.CHECK_ON_CPU, fused.PROBE_ON_CPU = True, True  # as on a CUDA GPU
    auto.CALLS, auto.ROUNDS, auto.COMPILE_BACKEND = 1, 1, "aot_eager"  # the graph, without a C++ build
    auto.seconds, auto.measure_in_child, auto.decide = fake_seconds, fake_child, timed_decide
    for kind in ("forward", "backward", "step"):
        setattr(triton_tssa.TritonKernels, kind, counted(kind, getattr(triton_tssa.TritonKernels, kind)))
    torch.compile = functools.partial(torch.compile, backend="aot_eager")  # train.py's --compile=True

    def run(main, argv):  # as from the command line; what main returns is not kept
        cli.run_cli(main, argv)

    def score(argv):  # evaluate.py's loss
        return {"loss": cli.run_cli(evaluate.main, argv)["loss"]}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        SCRATCH.append(tmp)
        text = os.path.join(tmp, "book.txt")
        with open(text, "w") as f:
            f.write("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300)))
        data, out = os.path.join(tmp, "data"), os.path.join(tmp, "out")
        run(prepare_char.main, [f"--input={text}", "--name=book", f"--data_dir={data}"])
        tiny = ["--dataset=book", f"--data_dir={data}", "--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=32",
                "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=1", "--eval_interval=1",
                "--eval_iters=1", "--log_interval=1", "--num_threads=1", "--device=cpu", "--warmup_iters=1",
                "--tssa_impl=auto"]
        flow("train", lambda: run(train.main, [*tiny, f"--out_dir={out}", "--dtype=float32", "--compile=False"]),
             results)
        flow("train again", lambda: run(train.main, [*tiny, f"--out_dir={out}-again", "--dtype=float32",
                                                     "--compile=False"]), results, cache=results["train"]["cache"])
        flow("train compiled bf16", lambda: run(train.main, [*tiny, f"--out_dir={out}-c", "--dtype=bfloat16",
                                                             "--compile=True"]), results)
        flow("sample", lambda: run(sample.main, [f"--out_dir={out}", "--tssa_impl=auto", "--start=the quick",
                                                 "--max_new_tokens=2", "--num_samples=1", "--device=cpu"]), results)
        flow("evaluate", lambda: score([f"--out_dir={out}", "--tssa_impl=auto", "--max_tokens=64",
                                            "--batch_size=2", "--device=cpu", f"--data_dir={data}"]), results)
        flow("evaluate cpu", lambda: score([f"--out_dir={out}", "--tssa_impl=cpu", "--max_tokens=64",
                                                "--batch_size=2", "--device=cpu", f"--data_dir={data}"]), results)
        flow("lm_inspect", lambda: run(lm_inspect.main, [f"--out_dir={out}", "--tssa_impl=auto", "--n_windows=1",
                                                         "--batch_size=1", "--layers=1", f"--page_dir={tmp}/page"]),
             results)

        def inference_mode_autocast():
            m = kernels.use(model.GPT(model.GPTConfig(block_size=32, vocab_size=40, n_layer=1, n_head=2, n_embd=32)),
                            "auto").eval()
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
                m(torch.randint(0, 40, (1, 24)))
        flow("inference_mode autocast", inference_mode_autocast, results)
        flow("a model, eager and compiled", a_model_eager_and_compiled, results, fresh=False)
        results["child"] = CHILD_TIMES
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
