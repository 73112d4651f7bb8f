"""
The whole-maths check of the fused kernels: model.py's operators as they are now (looked up by
name, so a fork's edit shows) against the fused kernels of an implementation, which compute the
shipped TSSA, on three small cases that reach the regimes a fork changes:
  - causal_tssa over a long prefix (past two of the kernels' scan steps of chunks, ending inside
    a chunk; for the Triton kernels, head width p over two of dL/dw's column blocks, the second
    part-filled), with Pi near 0 and near 1 (a position bias that peaks the softmax), heads of
    tiny, unit and large feature scale (s near 0, of order 1, ~1e6: f'(s) near 1, 1/2, 0);
  - tssa on the same regimes, with a padding mask;
  - decoding: causal_tssa's prefill of that long prompt (the running sums it leaves a state),
    then causal_tssa_step for a few tokens.
Every output, Pi, gradient and running sum is compared, each head relative to its own largest
value in either (a tiny head is not hidden by a large one; a quantity one side has as 0, a Pi
that takes nothing from its temperature, differs by 1). Forks it tells apart from the shipped maths,
tested in tests/test_checks.py: another Pi (a temperature inside it, a floor at 0.01), s
clipped, the step rescaled, one form edited and not the other.

Used where a fused implementation is chosen: kernels.use (tssa_impl=cpu, triton: a fork is
refused in one line, `check_maths`) and kernels/auto.py (tssa_impl=auto: the Triton kernels on
the device of the first call, the reference if they differ). It enables what it needs itself
(gradients, no inference mode, no autocast) and makes its own tensors from its own generator:
it runs the same under no_grad, inference_mode, autocast or inside torch.compile's trace, and
takes nothing from the run's random numbers. About 0.1 s with the C kernels.

    python -m pytest -q tests/test_checks.py
"""

import torch

import model
from kernels.fused import fused_ops

TOLERANCE = 1e-3  # fp32 sums in another order differ ~1e-6 relative; a fork by far more (tests/test_checks.py)
B, H = 2, 3
SCALES = (1e-3, 1.0, 1e3)  # the heads' feature scales: s ~1e-6, ~1, ~1e6
TEMP = {"causal_tssa": (0.7, 1.5, 3.0), "tssa": (20.0, 45.0, 90.0)}  # non-causal logits are ~temp p / T: larger
STEPS = 4  # decoding steps after the prefill

# What each compared tensor is, in MATH.md's words, and the dims reduced within a head (dtemp: the
# whole vector, a head's own may be a sum that cancels to ~0)
QUANTITIES = (("the update -Pi w f'(s)", (0, 2, 3)), ("Pi", (0, 2)), ("the gradient with respect to w", (0, 2, 3)),
              ("the gradient with respect to Pi's temperature", (0,)),
              ("the gradient with respect to the position bias", (1,)))
SUMS = (("the running sum of w^2", (0, 2)), ("the running sum of Pi w^2", (0, 2)), ("the running sum of Pi", (0,)))
STEP_QUANTITIES = (("the update -Pi w f'(s)", (0, 2, 3)), ("Pi", (0, 2))) + SUMS
PREFILL = "causal_tssa's prefill"  # the sums causal_tssa(..., state=) leaves for decoding
OPERATORS = ("causal_tssa", "tssa", PREFILL, "causal_tssa_step")  # in the order checked


def size(impl):
    """(T, p) of the cases for impl's kernels: T past two of their steps over chunks, ending
    inside a chunk; for the Triton kernels, p over two of dL/dw's column blocks, the second part-filled."""
    if impl == "triton":
        import kernels.triton_tssa as triton_tssa  # (imports Triton: asked only where the Triton kernels are checked)
        chunk, step = triton_tssa.BLOCK_T, triton_tssa.BLOCK_T * triton_tssa.SCAN_CHUNKS
        p = triton_tssa.FEATURE_BLOCK + max(1, triton_tssa.FEATURE_BLOCK // 2)
    else:
        from kernels.cpu import CKernels
        chunk = step = CKernels.L
        p = 8
    return 2 * step + chunk // 2 + 3, p


def features(T, p, gen):
    """w (B, H, T, p): each head at its scale, the energy of the tokens waving along the sequence
    (Pi's logits spread)."""
    w = torch.randn(B, H, T, p, generator=gen) * torch.tensor(SCALES).view(1, H, 1, 1)
    wave = torch.exp(1.5 * torch.sin(torch.arange(T) / 5.0 + 2.0 * torch.arange(H).view(H, 1)))  # (H, T)
    return w * wave.view(1, H, T, 1)


def position_bias(T):
    """(H, T + 8): a bias that makes one head win by far at some positions, another at others."""
    return 1.5 * torch.sin(torch.arange(T + 8) / 9.0 + 2.0 * torch.arange(H).view(H, 1))


def per_head(new, ref, dims):
    """The largest difference over the heads, each relative to the largest value in it of either
    (at most 2: 1 where one of them is 0)."""
    diff = (new.float() - ref.float()).abs().amax(dim=dims)
    largest = torch.maximum(new.float().abs().amax(dim=dims), ref.float().abs().amax(dim=dims))
    return (diff / largest.clamp_min(1e-30)).max().item()


def parallel(name, ops, device, T, p, seed):
    """Output, Pi and gradients of one parallel operator (name) of ops on its case."""
    gen = torch.Generator().manual_seed(seed)
    w0, g = features(T, p, gen), torch.randn(B, H, T, p, generator=gen)
    temp0 = torch.tensor(TEMP[name])
    w, temp, bias = (t.to(device).requires_grad_() for t in (w0, temp0, position_bias(T)))
    if name == "causal_tssa":
        out, pi = ops.causal_tssa(w, temp, bias, return_pi=True)
        leaves = (w, temp, bias)
    else:
        mask = torch.ones(B, T, dtype=torch.bool)
        mask[0, 2 * T // 3:] = False  # row 0 padded at its end, and one token inside row 1
        mask[1, T // 2] = False
        out, pi = ops.tssa(w, temp, return_pi=True, mask=mask.to(device))
        leaves = (w, temp)
    return (out, pi, *torch.autograd.grad(out, leaves, g.to(device)))


def sums(state):
    return state.sum_sq.clone(), state.sum_pi_sq.clone(), state.sum_pi.clone()


def decoding(ops, device, T, p):
    """A prompt of T tokens prefilled by ops.causal_tssa(..., state=), then STEPS tokens by
    ops.causal_tssa_step: the sums the prefill leaves; the steps' outputs, each step's Pi (what
    it adds to the running sum of Pi) and the sums after them."""
    gen = torch.Generator().manual_seed(2)
    w = features(T + STEPS, p, gen).to(device)
    temp, bias = torch.tensor(TEMP["causal_tssa"]).to(device), position_bias(T + STEPS).to(device)
    state = model.TSSAState.zeros(B, H, p, device)
    outs, pis = [], []
    with torch.no_grad():
        ops.causal_tssa(w[:, :, :T], temp, bias, state=state)
        prefill = sums(state)
        for t in range(T, T + STEPS):
            before = state.sum_pi.clone()
            outs.append(ops.causal_tssa_step(w[:, :, t], temp, bias[:, t], state))
            pis.append(state.sum_pi - before)
    return prefill, (torch.stack(outs, 2), torch.stack(pis, 2), *sums(state))


def differences(device, impl="triton"):
    """{(operator, quantity): difference} between the fused kernels of impl and model.py's
    operators as they are now, on the cases above on device: each the largest over the heads of
    the largest difference relative to the reference's largest value in that head."""
    device = torch.device(device)
    fused = fused_ops(impl)
    reference = model.TSSAOperators(model.tssa, model.causal_tssa, model.causal_tssa_step)  # as they are now
    T, p = size(impl)
    worst = {}
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        for seed, name in enumerate(("causal_tssa", "tssa")):
            got, want = parallel(name, fused, device, T, p, seed), parallel(name, reference, device, T, p, seed)
            for (quantity, dims), new, ref in zip(QUANTITIES, got, want):
                worst[name, quantity] = per_head(new, ref, dims)
        (prefill, got), (prefill_ref, want) = decoding(fused, device, T, p), decoding(reference, device, T, p)
        for (quantity, dims), new, ref in zip(SUMS, prefill, prefill_ref):
            worst[PREFILL, quantity] = per_head(new, ref, dims)
        for (quantity, dims), new, ref in zip(STEP_QUANTITIES, got, want):
            worst["causal_tssa_step", quantity] = per_head(new, ref, dims)
    return worst


def described(diffs):
    """What differs, in MATH.md's words: for each operator beyond TOLERANCE, the first quantity that
    does in the order Pi, the update, the gradients, the sums (the cause before its effects) and by
    how much; None if nothing does (nan differs)."""
    said = []
    for name in OPERATORS:
        mine = {q: d for (op, q), d in diffs.items() if op == name}
        order = sorted(mine, key=lambda q: q != "Pi")  # Pi first, then the order compared
        over = [q for q in order if not mine[q] <= TOLERANCE]
        if over:
            said.append(f"{name} in {over[0]} (by {mine[over[0]]:.2g} of its largest value)")
    return ", ".join(said) or None


def forms_agree():
    """Whether model.py's causal_tssa and causal_tssa_step, as they are now, compute the same maths:
    a prompt's parallel form against one step per token from an empty state, and against the
    prefill of its first half then steps (float64, 64 tokens over which each head wins somewhere)."""
    gen = torch.Generator().manual_seed(3)
    T, half, p = 64, 32, 8
    w = features(T, p, gen).double()
    temp, bias = torch.tensor(TEMP["causal_tssa"]).double(), position_bias(T).double()
    def steps(state, start):  # (B, H, T - start, p)
        return torch.stack([model.causal_tssa_step(w[:, :, t], temp, bias[:, t], state) for t in range(start, T)], 2)
    with torch.inference_mode(False), torch.no_grad():
        full = model.causal_tssa(w, temp, bias)
        from_empty = steps(model.TSSAState.zeros(B, H, p, dtype=torch.float64), 0)
        prefilled = model.TSSAState.zeros(B, H, p, dtype=torch.float64)
        model.causal_tssa(w[:, :, :half], temp, bias, state=prefilled)
        after = steps(prefilled, half)
    return max(per_head(from_empty, full, (0, 2, 3)), per_head(after, full[:, :, half:], (0, 2, 3))) <= 1e-9


def mismatch(impl, diffs):
    """One line saying what differs, or None if nothing does: the operators and quantities in
    MATH.md's words, and advice that runs what model.py says."""
    what = described(diffs)
    if what is None:
        return None
    advice = ": use tssa_impl=torch, which runs model.py's maths"
    if not forms_agree():
        advice = ("; and model.py's causal_tssa and causal_tssa_step no longer compute the same maths (decoding "
                  "would not run what was trained): edit both alike (MATH.md §9), then use tssa_impl=torch")
    return f"tssa_impl={impl} computes the shipped TSSA, and model.py's operators differ from it: {what}{advice}"
