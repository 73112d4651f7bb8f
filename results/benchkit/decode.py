"""
results/benchkit/decode.py: the report's section decode: one token at a time after T tokens of context,
batch 1, ToST-Base by tssa_impl from its recurrent state and GPT-2 Base from its static KV
cache, each eager, replayed as a CUDA graph, and compiled then replayed (DECODE_MODES).
"""

from functools import partial

import torch

import kernels
from nanotost import devices
from results.benchkit.part import fallback_note, why_not
from results.benchkit.settings import plan_lengths
from results.benchkit.timing import measure_row
from results.benchkit.train_step import build_gpt

DECODE_CONTEXTS = [1024, 65536, 4096, 16384, 32768]  # the two ends of the target first
DECODE_MODES = {"compiled": "torch.compile of GPT.step replayed as a CUDA graph (kernels.CompiledStep)",
                "captured": "GPT.step op by op, replayed as a CUDA graph (kernels.CapturedStep)",
                "eager": "GPT.step op by op",
                "autotuned": "torch.compile of GPT.step with Inductor's autotuning (mode max-autotune-no-cudagraphs), "
                             "replayed as a CUDA graph (sample.py --cuda_graph=autotuned)"}


REPORT_MODES = ("compiled", "captured", "eager")  # the report's (the headline adds autotuned: its compile is long)


def decode_cases(contexts, modes=REPORT_MODES):
    """(arch, impl, mode, T) of every decode row, the target's first (a cut section keeps them):
    each of `modes` at every context, for ToST-Base by tssa_impl (torch: model.py's step;
    triton: the fused step kernel) and GPT-2 Base."""
    for mode in modes:
        for T_ in contexts:
            for arch, impl in (("tost", "torch"), ("tost", "triton"), ("gpt2", None)):
                yield arch, impl, mode, T_


def decode_rows(cfg, cuda, modes=REPORT_MODES):
    """The identifying fields of every row (decode_cases at decode_T; a CPU adds the eager step)."""
    modes = tuple(modes) + (("eager",) if not cuda and "eager" not in modes else ())
    return [{k: v for k, v in dict(arch=arch, impl=impl, mode=mode, T=T_, B=1).items() if v is not None}
            for arch, impl, mode, T_ in decode_cases(plan_lengths(cfg.decode_T, DECODE_CONTEXTS), modes)]


def section_decode(S, modes=REPORT_MODES):
    """One token at a time after T tokens: ToST from its recurrent state, GPT-2 from a static KV
    cache of T + a few tokens; bf16 weights on CUDA (model.to(dtype), no autocast: an inference
    copy); eager, replayed as a CUDA graph, and compiled then replayed (DECODE_MODES). The
    states are synthetic (filled as if T tokens had been read): the cost does not depend on
    their values. Every ToST model is built for the longest context, so its compiled step is
    compiled once and serves every context (its cost does not depend on block_size). modes: a
    subset of DECODE_MODES; a CPU runs the eager step too (the code path of the rows it cannot run)."""
    cfg = S.cfg
    dtype = devices.DTYPES[cfg.dtype]
    contexts = plan_lengths(cfg.decode_T, DECODE_CONTEXTS)
    modes = tuple(modes) + (("eager",) if not S.cuda and "eager" not in modes else ())
    S.data.update(modes={m: DECODE_MODES[m] for m in modes}, dtype=cfg.dtype)
    # GPT.step's compiled graphs: ToST's two (torch, triton) and GPT-2's, one per KV length; past
    # the limit Dynamo would run the step uncompiled, under a "compiled" label
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 + len(contexts) + 2)
    for key in decode_rows(cfg, S.cuda, modes):
        arch, impl, mode, T_ = key["arch"], key.get("impl"), key["mode"], key["T"]
        why = why_not(S, mode) or (why_not(S, "triton") if impl == "triton" else None)
        if why:
            S.row(**key, status="skipped", reason=why)
            continue
        S.attempt(key, partial(decode_row, cfg, arch, impl, mode, T_, max(contexts), dtype))


def decode_row(cfg, arch, impl, mode, T_, longest, dtype):
    steps = cfg.decode_steps
    length = (longest if arch == "tost" else T_) + steps + 8
    m = build_gpt(cfg, arch, length, impl or "torch").to(cfg.device, dtype).eval()
    state, c = m.init_state(1), m.config
    for s in state.layers:  # as if T_ tokens had been prefilled
        if arch == "gpt2":
            shape = (1, c.n_head, s.max_len, c.n_embd // c.n_head)
            s.k, s.v = (torch.randn(shape, device=cfg.device, dtype=dtype) for _ in range(2))
        else:
            s.sum_sq.uniform_(1, 2).mul_(T_)
            s.sum_pi_sq.uniform_(1, 2).mul_(T_ / c.n_head)
            s.sum_pi.fill_(T_ / c.n_head)
    tok = torch.randint(0, 50257, (1, 1), device=cfg.device)
    step = m.step  # (tok, state) -> logits
    if mode != "eager":
        kernels.capture_steps(m, **kernels.CAPTURES[{"captured": "auto"}.get(mode, mode)])
        step = m.step

    def tokens():  # `steps` tokens from context T_ (the position set back first: a device write)
        state.pos.fill_(T_)
        for _ in range(steps):
            step(tok, state)
    with torch.no_grad():
        row = measure_row(tokens, cfg, profile_calls=1)
    for k in ("ms", "gpu_ms", "kernels", "memops"):
        if isinstance(row.get(k), float):
            row[k] /= steps  # per token
    row["ms_all"] = [t / steps for t in row["ms_all"]]
    row["top_kernels"] = [[n, c / steps, t / steps] for n, c, t in row.get("top_kernels", [])]
    row.update(state_mb=sum(s.nbytes() for s in state.layers) / 2**20, tokens_per_timing=steps, dtype=cfg.dtype)
    note = fallback_note(impl)
    if note:
        row.update(status="fell_back", reason=note)
    return row

