"""
The checks that a forker's maths runs everywhere or is refused (MATH.md §9), in one home: what a
script runs at its start on the model it built or loaded, and what the fused kernels run before
they take model.py's place.

1. Decoding against training (check_decoding, decoding_differs): the recurrent form (a prompt in
   parallel, then a step per token from the state it leaves) against the parallel form, on a copy
   of the model whose every module acts (acting_copy: no identity of a fresh layer scale or
   convolution hides a state), each kind of attention alone, then the model as GPT.generate runs
   it; a fork whose two forms differ is said in one line at the start, naming the block and the
   module where they first differ (the attention's form, or a module outside it whose state is
   not in the block's). generator: how a reader generates then (generate_in_parallel: by the
   parallel form alone).
2. The fused kernels against model.py's operators (kernel_differences, mismatch): model.py's
   operators as they are now (looked up by name, so a fork's edit shows) against the fused kernels
   of an implementation, which compute the shipped TSSA, on three small cases that reach the
   regimes a fork changes:
     - causal_tssa over a long prefix (past two of the kernels' scan steps of chunks, ending inside
       a chunk; the kernels say how long: kernels.case_size), with Pi near 0 and near 1 (a position
       bias that peaks the softmax), heads of tiny, unit and large feature scale (s near 0, of order
       1, ~1e6: f'(s) near 1, 1/2, 0);
     - tssa on the same regimes, with a padding mask;
     - decoding: causal_tssa's prefill of that long prompt (the running sums it leaves a state),
       then causal_tssa_step for a few tokens.
   Every output, Pi, gradient and running sum is compared, each head relative to its own largest
   value in either (a tiny head is not hidden by a large one; a quantity one side has as 0, a Pi
   that takes nothing from its temperature, differs by 1). Forks it tells apart from the shipped
   maths, tested in tests/test_checks.py: another Pi (a temperature inside it, a floor at 0.01),
   s clipped, the step rescaled, one form edited and not the other. kernels.use runs it for
   tssa_impl=cpu and triton (a fork is refused in one line), kernels/auto.py for auto (the
   reference where they differ). It enables what it needs itself (gradients, no inference mode,
   no autocast) and makes its own tensors from its own generator: the same under no_grad,
   inference_mode, autocast or inside torch.compile's trace, and nothing taken from the run's
   random numbers. About 0.1 s with the C kernels. And what kernels.use can put a kernel in:
   operators_unused, a TSSA's own forward that calls none of its operators (a statistic with an
   input of its own: a fused tssa_impl would run no kernel there); pi_named, a Pi in a message.
3. The statistic lm_inspect.py draws (statistic_unused): each TSSA block's output rebuilt from
   model.py's s of its own w and Pi; a block whose output is not (a fork's statistic, its own
   forward) is said in one line.

    python -m pytest -q tests/test_decode.py tests/test_checks.py tests/test_fork.py
"""

import copy
import math
import sys
from contextlib import contextmanager
from functools import partial

import torch

import model
from nanotost import cli

# -----------------------------------------------------------------------------
# 1. decoding: the recurrent form (a prompt in parallel, then a step per token from the state it
# leaves) against the parallel form; a fork whose two forms differ is told so at the start

DECODE_TOKENS = 6  # the check's sequence: a 1-token prompt then 5 steps; a 4-token prompt then 2 steps
DECODE_TOLERANCE = 1e-3  # of the largest output of either form (fp32 sums in other orders differ ~1e-6)


def decoding_forms(attn):
    """How a forker names the forms of an attention module: (the step, the parallel form, the
    prefill). A TSSA that runs TSSA.forward: its operators' functions (model.py's by their
    names); any other attention (a TSSA subclass with its own forward too): its forward."""
    if isinstance(attn, model.TSSA) and type(attn).forward is model.TSSA.forward:
        ops = attn.operators
        step, parallel = (("model.causal_tssa_step", "model.causal_tssa") if ops is model.REFERENCE_OPERATORS else
                          [getattr(fn, "__qualname__", repr(fn)) for fn in (ops.causal_tssa_step, ops.causal_tssa)])
        return step, parallel, f"{parallel} given state="
    name = type(attn).__name__
    return f"{name}.forward of one token from a state", f"{name}.forward", f"{name}.forward of a prompt given a state"


def form_differs(attn, x):
    """None where attn decodes x (1, T, C) as its parallel forward computes it, from a 1-token
    prompt and from a (T - 2)-token prompt (then a step per token), else which form differs and
    what to edit. attn runs in eval mode (no dropout), and is left as it was."""
    step, parallel, prefill = decoding_forms(attn)
    was_training = attn.training
    attn.eval()
    try:
        full = attn(x).float()  # (1, T, C)
        T = x.shape[1]
        for k, form in [(1, "step")] + ([(T - 2, "prefill")] if T >= 4 else []):  # (a prompt of 2+ tokens)
            pos = torch.zeros((), dtype=torch.long, device=x.device)  # GPT.step's counter, advanced here
            try:
                state = attn.init_state(1, pos)
                got = [attn(x[:, :k], state=state)]
                for t in range(k, T):
                    pos.fill_(t)
                    got.append(attn(x[:, t:t + 1], state=state))
            except Exception as e:  # noqa: BLE001 (a form that cannot run is reported, as one that differs)
                edit = step if form == "step" else prefill
                return f"its {form} raised {first_line(e)}: edit {edit} (MATH.md §9)"
            gap = relative_gap(torch.cat(got, 1).float(), full)
            if not gap <= DECODE_TOLERANCE:  # (nan differs too)
                if form == "step":
                    return (f"its decoding step differs from its parallel form by {gap:.2g} of the largest output "
                            f"(a 1-token prompt, then steps): edit {step} and {parallel} together (MATH.md §9)")
                return (f"the state its prefill leaves differs from the sums its step keeps (the steps after a "
                        f"{k}-token prompt are off by {gap:.2g} of the largest output): {prefill} must write "
                        f"the running sums at the prompt's last token, as {step} keeps them (MATH.md §9)")
    finally:
        attn.train(was_training)
    return None


def relative_gap(got, want):
    """The largest difference of got and want, relative to the largest value of either (at most 2)."""
    largest = torch.maximum(got.abs().max(), want.abs().max()).clamp_min(torch.finfo(torch.float32).tiny)
    return ((got - want).abs().max() / largest).item()


def first_line(e):
    """An exception as `Type (its first line)`, for a one-line message."""
    return f"{type(e).__name__} ({(str(e).strip().splitlines() or [''])[0][:120]})"


def state_owner(i, block, layer):
    """Who makes block i's decoding state `layer` (Block.init_state's): its attention, where the state is the
    attention's (as shipped), else the block, which keeps state of its own beside it (MATH.md §9). Returns (where,
    the class whose init_state makes it)."""
    try:
        attention_state = block.attn.init_state(1, torch.zeros((), dtype=torch.long))
    except Exception:  # noqa: BLE001 (an attention that cannot decode: its state is told as its own)
        return f"blocks.{i}.attn ({type(block.attn).__name__})", type(block.attn).__name__
    if type(layer) is type(attention_state):
        return f"blocks.{i}.attn ({type(block.attn).__name__})", type(block.attn).__name__
    return f"blocks.{i} ({type(block).__name__})", type(block).__name__


def state_differs(gpt, state):
    """None where every block's state of a new decoding (GPT.init_state) is what GPT.prefill can
    start over for a new prompt: tensors (in a dataclass, tuple, list or dict: model.state_tensors),
    zeros; else one line naming the block (or its attention) and the init_state that makes it."""
    for i, (block, layer) in enumerate(zip(gpt.blocks, state.layers)):
        where, owner = state_owner(i, block, layer)
        try:
            tensors = list(model.state_tensors(layer))
        except TypeError as e:
            return (f"{where}: GPT.prefill cannot start its state over for a new prompt ({e}): make "
                    f"{owner}.init_state return tensors in one of those (MATH.md §9)")
        if any(t.any() for t in tensors):
            return (f"{where}: {owner}.init_state gives a state that is not all zeros, while "
                    "GPT.prefill starts a new prompt from zeros: make it zeros (MATH.md §9)")
    return None


@contextmanager
def outputs_of_blocks(gpt):
    """{name: [its output at each call]} of every module inside gpt's blocks, filled while the block runs, in the
    order the modules finish (a module's own before its block's)."""
    outputs, hooks = {}, []
    for name, module in gpt.blocks.named_modules(prefix="blocks"):
        def keep(module, inputs, output, name=name):
            outputs.setdefault(name, []).append(output.detach().clone() if torch.is_tensor(output) else None)
        hooks.append(module.register_forward_hook(keep))
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


def first_differing(parallel, decoded):
    """(name, gap) of the first module (in the order they finish) whose outputs over the tokens, a prompt's then one
    a step (decoded), differ from its parallel form's (parallel) by more than DECODE_TOLERANCE; None if none does.
    Only tensors of (B, T, ...) are compared (a step's ln_f of the last token alone is not)."""
    for name, (whole,) in ((n, outs) for n, outs in parallel.items() if len(outs) == 1):
        parts = decoded.get(name) or [None]
        if whole is None or whole.dim() < 2 or any(part is None or part.dim() != whole.dim() for part in parts):
            continue
        joined = torch.cat(parts, dim=1)
        if joined.shape == whole.shape:
            gap = relative_gap(joined.float(), whole.float())
            if not gap <= DECODE_TOLERANCE:
                return name, gap
    return None


def where_it_differs(gpt, parallel, decoded, gap, prompt):
    """The line of a decoding that differs from GPT.forward (gap: of the largest logit, after `prompt`): the module
    where it first differs, and what MATH.md §9 says of a state there (the attention's, outside it, GPT's own)."""
    found = first_differing(parallel, decoded)
    parts = found[0].split(".") if found else []
    said = (f"GPT.prefill then GPT.step differ from GPT.forward by {gap:.2g} of the largest logit ({prompt}, then "
            "steps)")
    if not found:  # (GPT's own: its embeddings, its final norm)
        return f"{said}: edit GPT.prefill and GPT.step to compute as GPT.forward (MATH.md §9)"
    if len(parts) >= 3 and parts[2] == "attn":  # the attention, alone right (form_differs), is not in a new prompt
        return (f"blocks.{parts[1]}.attn ({type(gpt.blocks[int(parts[1])].attn).__name__}): {said}: GPT.prefill "
                "starts a state over by zeroing its tensors, so keep in tensors whatever the state changes "
                "(MATH.md §9)")
    module = gpt.get_submodule(found[0])
    return (f"{found[0]} ({type(module).__name__}), outside the attention, gives other outputs when decoding than in "
            f"the parallel form (by {found[1]:.2g} of its largest; {said}): a module that remembers earlier tokens "
            "keeps them in the block's decoding state beside the attention's (Block.init_state makes it, "
            "Block.forward hands it on; MATH.md §9, state outside the attention)")


def generation_differs(gpt, T):
    """None where gpt decodes as GPT.generate runs it (GPT.init_state, GPT.prefill, which starts the
    state over, and GPT.step) to the logits of its parallel forward: a 1-token prompt then steps from
    a new state, a (T - 2)-token prompt then steps in the same state (a new prompt), every tensor of
    the state written in place (a CUDA graph of GPT.step replays the same buffers); else one line,
    naming the module where the two first differ (where_it_differs)."""
    weight = gpt.lm_head.weight
    idx = torch.randint(0, gpt.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    idx = idx.to(weight.device)
    with outputs_of_blocks(gpt) as parallel:
        full = gpt(idx)[0][0].float()  # (T, V)
    state, buffers = gpt.init_state(1), None
    line = state_differs(gpt, state)
    if line:
        return line
    for k in [1] + ([T - 2] if T >= 4 else []):
        try:
            with outputs_of_blocks(gpt) as decoded:
                got = [gpt.prefill(idx[:, :k], state)[0]] + [gpt.step(idx[:, t:t + 1], state)[0] for t in range(k, T)]
        except Exception as e:  # noqa: BLE001 (a decoding that cannot run is reported, as one that differs)
            return f"GPT.prefill then GPT.step raised {first_line(e)} (MATH.md §9)"
        gap = relative_gap(torch.stack(got).float(), full[k - 1:])
        if not gap <= DECODE_TOLERANCE:
            prompt = "a 1-token prompt" if buffers is None else f"a new {k}-token prompt in the same state"
            return where_it_differs(gpt, parallel, decoded, gap, prompt)
        now = [[t.data_ptr() for t in model.state_tensors(layer)] for layer in state.layers]
        moved = [i for i, (was, is_) in enumerate(zip(buffers or now, now)) if was != is_]
        if moved:
            where, _ = state_owner(moved[0], gpt.blocks[moved[0]], state.layers[moved[0]])
            return (f"{where}: its decoding state's tensors are replaced, not written in place, and a CUDA graph of "
                    "GPT.step (sample.py on a GPU) would replay the old ones: write them in place (copy_, add_; "
                    "MATH.md §9)")
        buffers = now
    return None


@torch.no_grad()
def acting_copy(gpt):
    """A copy of gpt in which every module acts: its parameters drawn at full scale (matrices of variance 1 / their
    width, vectors and numbers in [0.5, 1.5]) by a generator of its own, where a model starts some as the
    identity (a layer scale of 1e-5, a convolution of one tap) and would hide a state kept in them until it has
    trained. Its operators are gpt's (the fused kernels a reader runs: shared, not copied). None where gpt cannot
    be copied (a fork's object deepcopy cannot take)."""
    shared = {id(m.operators): m.operators for m in gpt.modules() if hasattr(m, "operators")}
    try:
        twin = copy.deepcopy(gpt, memo=shared)
    except Exception:  # noqa: BLE001 (then the check runs on gpt as it is)
        return None
    generators = {}
    for p in twin.parameters():  # uniform draws in place (one pass), on p's device
        gen = generators.setdefault(p.device, torch.Generator(p.device).manual_seed(0))
        if p.dim() >= 2:  # variance 1 / width
            p.uniform_(-math.sqrt(3.0 / p.shape[-1]), math.sqrt(3.0 / p.shape[-1]), generator=gen)
        else:
            p.uniform_(0.5, 1.5, generator=gen)
    return twin


@torch.no_grad()
def decoding_differs(gpt, tokens=DECODE_TOKENS):
    """None where gpt decodes as its parallel form computes, else one line: the block, the module and
    the form that differs (the step, the prefill, the state) and what to edit; on acting_copy(gpt)
    (every module acting, as after training), or gpt itself where it cannot be copied. First each
    kind of attention alone (form_differs on a random x (1, tokens, C), once per class and
    operators), then the model as GPT.generate runs it (generation_differs). The model is left as it
    was (its weights, its modes), and the global RNG is not drawn from."""
    twin = acting_copy(gpt)
    return forms_differ(gpt if twin is None else twin, tokens)


def forms_differ(gpt, tokens):
    """decoding_differs on gpt itself."""
    weight, T = gpt.lm_head.weight, min(tokens, gpt.config.block_size)
    x = torch.randn(1, T, gpt.config.n_embd, generator=torch.Generator().manual_seed(0))  # the global RNG untouched
    seen = set()
    for i, block in enumerate(gpt.blocks):
        kind = (type(block.attn), getattr(block.attn, "operators", None))
        if kind not in seen:
            seen.add(kind)
            line = form_differs(block.attn, x.to(weight.device, weight.dtype))
            if line:
                return f"blocks.{i}.attn ({type(block.attn).__name__}): {line}"
    modes = {module: module.training for module in gpt.modules()}
    gpt.eval()
    try:
        return generation_differs(gpt, T)
    finally:
        for module, training in modes.items():
            module.train(training)


def check_decoding(gpt, then, speak=True):
    """decoding_differs(gpt), said as one warning line on stderr that ends with `then` (what the
    script does about it), where speak (rank 0 of a DDP run); returns it (None: the forms agree)."""
    line = decoding_differs(gpt) if speak else None
    if line:
        print(f"{cli.script_name(sys.argv[0])}: warning: decoding differs from the parallel form: {line}; {then}",
              file=sys.stderr)
    return line


def generator(gpt, then, speak=True):
    """How a reader generates with gpt: GPT.generate, from its decoding state; or, for a fork whose
    decoding differs from its parallel form (check_decoding: said in one line that ends with `then`),
    generate_in_parallel."""
    return partial(generate_in_parallel, gpt) if check_decoding(gpt, then, speak) else gpt.generate


@torch.no_grad()
def generate_in_parallel(gpt, idx, max_new_tokens, temperature=1.0, top_k=None, tokenizer_vocab_size=None):
    """GPT.generate by the parallel form alone (for a model whose decoding differs from it): each
    new token from a full forward over the last block_size tokens, O(T) per token."""
    for _ in range(max_new_tokens):
        logits, _ = gpt(idx[:, -gpt.config.block_size:])  # (B, T, V)
        idx = torch.cat([idx, model.sample_token(logits[:, -1, :tokenizer_vocab_size], temperature, top_k)], dim=1)
    return idx


# -----------------------------------------------------------------------------
# 2. the fused kernels against model.py's operators as they are now

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


def kernel_differences(fused, device, T, p):
    """{(operator, quantity): difference} between the fused operators `fused` (model.TSSAOperators
    of a kernels implementation) and model.py's operators as they are now, on the cases above of T
    tokens and head width p (kernels.case_size: what reaches the kernels' chunk and scan steps) on
    device: each the largest over the heads of the largest difference relative to the reference's
    largest value in that head."""
    device = torch.device(device)
    reference = model.TSSAOperators(model.tssa, model.causal_tssa, model.causal_tssa_step)  # as they are now
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


def counted(function, calls):
    """function, which also appends itself to calls when called."""
    def counting(*args, **kwargs):
        calls.append(function)
        return function(*args, **kwargs)
    return counting


@torch.no_grad()
def operators_unused(attn):
    """Whether a TSSA's forward calls none of its operators (a subclass's forward of its own maths, a
    statistic with an input of its own: a fused tssa_impl, which replaces the operators, would run no kernel
    in it), tried once on a few random tokens in eval mode; False for TSSA.forward, and where the forward
    cannot run alone (it says so itself when it runs). The module is left as it was."""
    if type(attn).forward is model.TSSA.forward:
        return False
    calls, ops, was_training = [], attn.operators, attn.training
    attn.operators = model.TSSAOperators(*(counted(fn, calls) for fn in ops))
    try:
        weight = attn.w_proj.weight
        x = torch.randn(1, 4, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight)
        attn.eval()
        attn(x)
    except Exception:  # noqa: BLE001 (a forward that needs more than x: not this check's to say)
        return False
    finally:
        attn.operators = ops
        attn.train(was_training)
    return not calls


def pi_named(pi_mode):
    """How messages name a Pi: pi='half' (a name of model.PI_MODES), or its own function's name (a subclass's)."""
    return f"pi={pi_mode!r}" if isinstance(pi_mode, str) else f"its own Pi, {getattr(pi_mode, '__qualname__', pi_mode)}"


# -----------------------------------------------------------------------------
# 3. the statistic lm_inspect.py draws, against each block's own output

STATISTIC_TOLERANCE = 1e-4  # of a block's largest output: its step rebuilt from s (fp32, a few ops apart: ~1e-6)


def running_statistic(w, pi):
    """s_k(j) of MATH.md §4.3, the prefix Pi-weighted second moment: w (B, H, T, p), pi (B, H, T)
    -> (B, H, T, p), in fp32 for fp16/bf16 w (as causal_tssa keeps it), by model.py's own
    functions (the prefix sums of causal_tssa, the one definition of s: model.token_statistic)."""
    w_sq = w.to(model.stat_dtype(w.dtype)).square()
    pi = pi.to(w_sq.dtype)[..., None]  # (B, H, T, 1)
    return model.token_statistic(model.prefix_sum(pi * w_sq), model.prefix_sum(pi)[..., 0])


@torch.no_grad()
def statistic_unused(gpt, layer_maps):
    """None where each TSSA block's output is c_proj of the step -Pi w f'(s) with model.py's s of its
    own w and Pi (running_statistic), as TSSA.forward computes it; else one line: the first block
    whose output is not (a fork's statistic, or its own forward), whose s lm_inspect.py draws as
    model.py's. layer_maps: each block's record (z, w, pi, out), None for a block without TSSA."""
    for i, (block, maps) in enumerate(zip(gpt.blocks, layer_maps)):
        if maps is None:
            continue
        w, pi, out = maps["w"], maps["pi"], maps["out"].float()
        try:
            step = -pi[..., None] * w * model.f_prime(running_statistic(w, pi)).to(w.dtype)  # (B, H, T, p)
            rebuilt = block.attn.c_proj(model.merge_heads(step)).float()
            gap = relative_gap(rebuilt, out)
        except Exception:  # noqa: BLE001 (an attention without TSSA's parts, e.g. no c_proj: said as one that differs)
            gap = None
        if gap is None or not gap <= STATISTIC_TOLERANCE:  # (nan differs too)
            return (f"blocks.{i}.attn ({type(block.attn).__name__}): its output is not c_proj of -Pi w f'(s) for "
                    "model.py's statistic s of its w and Pi (model.token_statistic over each prefix, MATH.md §4.3), "
                    "which the page draws: its own s differs (a fork's operators or forward)")
    return None
