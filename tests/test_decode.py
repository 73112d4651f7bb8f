"""
Decoding that a CUDA graph can replay, and the loss that lets a long context fit (model.py):

  - GPT.step runs the same operations on tensors of the same shapes at every position, never
    reads a value back to the host (no .item(), no sync), and writes the decoding state in
    place (its tensors keep their storage): the conditions under which one recorded CUDA graph
    serves every token. Checked on the CPU with a TorchDispatchMode that sees every aten call.
  - prefill + steps give the logits of the full parallel forward (every attention kind);
    a new prompt reuses the same buffers; so does the step compiled (kernels.CompiledStep).
    The scripts' start check (forks.decoding_differs) agrees for every kind and names the
    form that differs (the step, the prefill, the state) and the functions to edit.
    The kinds are read from the registries: every attention of model.ATTENTIONS and every Pi of
    model.PI_MODES, with the variants (MATH.md §9: a fork registered in model.py is tested here).
  - kernels/cross_entropy.py's chunked loss equals F.cross_entropy (loss and both gradients)
    without holding the (N, V) logits at once, and a GPT computes the same loss either way.

    python -m pytest -q tests/test_decode.py
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
import model
from kernels import cross_entropy
from model import GPT, GPTConfig
from nanotost import forks

KINDS = {**{attn: dict(attn=attn) for attn in model.ATTENTIONS},  # every attention, every Pi, and the variants
         **{f"tssa pi={pi}": dict(attn="tssa", pi=pi) for pi in model.PI_MODES if pi != "softmax"},
         "tssa+short_conv": dict(attn="tssa", short_conv=4), "softmax, no layer scale": dict(attn="softmax",
                                                                                              layer_scale_init=None),
         "hybrid": dict(attn="tssa", hybrid_every=2, short_conv=3)}


def tiny(kind, **kw):
    torch.manual_seed(0)
    cfg = dict(block_size=24, vocab_size=31, n_layer=2, n_head=2, n_embd=16, layer_scale_init=1.0)
    return GPT(GPTConfig(**{**cfg, **KINDS[kind], **kw})).eval()


def to_edit(m):
    """The message of a failed comparison of the forms: what differs, and the functions to edit."""
    forms = {forks.decoding_forms(block.attn)[:2] for block in m.blocks}
    edit = "; ".join(f"{step} and {parallel}" for step, parallel in sorted(forms))
    return lambda text: f"{text}\nprefill + steps differ from GPT.forward: edit {edit} together (MATH.md §9)"


def fused_refuses(m):
    """Whether tssa_impl=cpu/triton refuse m: a TSSA with its own operators, or a Pi they do not compute."""
    return any(isinstance(b.attn, model.TSSA) and (not kernels.owned(b.attn.operators)
                                                   or b.attn.pi_mode not in kernels.FUSED_PI_MODES) for b in m.blocks)


@pytest.mark.parametrize("impl", ["torch", "cpu"])
def test_the_start_check_finds_every_kind_decoding_as_it_trains_and_leaves_the_model_as_it_was(impl):
    """forks.decoding_differs, which train.py, sample.py and lm-eval's generation run first: None
    for every attention the code ships (and the C kernels' forms where they take it: they refuse a
    kind whose maths they do not compute, in one line), the model left in the mode it was in, and
    the global RNG not drawn from (a run's batches and dropout stay what they were)."""
    for kind in KINDS:
        if impl != "torch" and fused_refuses(tiny(kind)):
            with pytest.raises(ValueError, match=f"^tssa_impl={impl} .*: use tssa_impl=torch"):
                kernels.use(tiny(kind), impl)
            continue
        m = kernels.use(tiny(kind).train(), impl)
        rng = torch.get_rng_state()
        assert forks.decoding_differs(m) is None, kind
        assert m.training and all(module.training for module in m.modules()), kind
        assert torch.equal(torch.get_rng_state(), rng), kind


def test_the_start_check_names_the_form_that_differs(monkeypatch):
    """The step edited alone (its sums halved before the token): the step is named, with both
    functions to edit; the prefill made to write nothing: the prefill is named."""
    step = model.causal_tssa_step

    def halved_step(w_t, gamma, pos_bias_t, state, pi_mode="softmax"):
        state.sum_pi_sq.mul_(0.5)
        return step(w_t, gamma, pos_bias_t, state, pi_mode)
    monkeypatch.setattr(model, "causal_tssa_step", halved_step)
    line = forks.decoding_differs(tiny("hybrid"))
    assert line.startswith("blocks.0.attn (TSSA): its decoding step differs from its parallel form by "), line
    assert line.endswith("edit model.causal_tssa_step and model.causal_tssa together (MATH.md §9)"), line
    monkeypatch.setattr(model, "causal_tssa_step", step)
    parallel = model.causal_tssa
    monkeypatch.setattr(model, "causal_tssa", lambda *args, state=None, **kw: parallel(*args, **kw))
    line = forks.decoding_differs(tiny("tssa"))
    assert line.startswith("blocks.0.attn (TSSA): the state its prefill leaves differs from the sums its step keeps "
                           "(the steps after a 4-token prompt are off by "), line
    assert "model.causal_tssa given state= must write the running sums at the prompt's last token" in line


class OpLog(TorchDispatchMode):
    """Every aten operation with the shapes and dtypes of its tensor arguments."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        shapes = [(tuple(a.shape), a.dtype) for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        self.ops.append((str(func), tuple(shapes)))
        return func(*args, **kwargs)


def state_storage(state):
    """The data_ptr of every tensor of a DecodeState, in order (model.state_tensors)."""
    return [t.data_ptr() for t in model.state_tensors(state)]


@pytest.mark.parametrize("kind", KINDS)
def test_step_is_the_same_ops_at_every_position_without_host_sync_or_new_state(kind):
    m = tiny(kind)
    idx = torch.randint(0, 31, (2, 20))
    with torch.no_grad():
        state = m.init_state(2)
        m.prefill(idx[:, :5], state)
        before = state_storage(state)
        logs = []
        for t in range(5, 12):  # positions 5..11
            with OpLog() as log:
                m.step(idx[:, t:t + 1], state)
            logs.append(log.ops)
    assert all(ops == logs[0] for ops in logs[1:]), "a step's operations depend on the position"
    names = {name for name, _ in logs[0]}
    assert not any("_local_scalar_dense" in n or "item" in n for n in names), "a step reads a value back"
    assert state_storage(state) == before  # the state is written in place, never replaced
    assert state.pos.item() == 12


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_steps_equal_the_parallel_forward_and_a_new_prompt_reuses_the_buffers(kind):
    m = tiny(kind)
    idx = torch.randint(0, 31, (2, 24))
    with torch.no_grad():
        full, _ = m(idx)  # (B, T, V)
        state = m.init_state(2)
        got = [m.prefill(idx[:, :9], state)]
        got += [m.step(idx[:, t:t + 1], state) for t in range(9, 24)]
        # float32: the recurrent and the parallel forms sum in different orders (1e-5 on O(1) logits)
        torch.testing.assert_close(torch.stack(got, 1), full[:, 8:], rtol=0, atol=1e-5, msg=to_edit(m))
        ptrs = state_storage(state)
        again = m.prefill(idx[:, :4], state)  # a new prompt: the state starts over in the same buffers
        torch.testing.assert_close(again, full[:, 3], rtol=0, atol=1e-5, msg=to_edit(m))
        assert state_storage(state) == ptrs and state.pos.item() == 4


def test_captured_step_is_only_used_on_cuda_and_decoding_is_eager_elsewhere():
    m = tiny("tssa")
    prompt = torch.randint(0, 31, (1, 4))
    plain = m.generate(prompt, 6, temperature=0)
    kernels.capture_steps(m)
    assert isinstance(m.step, kernels.CapturedStep)
    assert torch.equal(m.generate(prompt, 6, temperature=0), plain)


@pytest.mark.parametrize("kind", ["softmax", "hybrid"])
def test_a_kv_cache_model_slides_its_window_past_block_size(kind):
    """30 new tokens after a 20-token prompt with block_size 24: the window slides (encoded
    again), so each greedy token is the argmax of the full forward over the last 24 tokens."""
    m = tiny(kind)
    out = m.generate(torch.randint(0, 31, (1, 20)), 30, temperature=0)
    with torch.no_grad():
        for t in range(20, 50):
            logits, _ = m(out[:, max(0, t - 24):t])
            assert logits[0, -1].argmax().item() == out[0, t].item()


@pytest.mark.parametrize("kind", ["tssa", "softmax"])  # ToST and, for a fair row, GPT-2
def test_compiled_step_equals_the_parallel_forward_in_one_graph(kind):
    from torch._dynamo.utils import counters
    m = tiny(kind)
    idx = torch.randint(0, 31, (2, 24))
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        full, _ = m(idx)  # (B, T, V)
        state = m.init_state(2)
        kernels.capture_steps(m, compiled=True, backend="aot_eager")  # Inductor's graph, without its C++ build
        assert isinstance(m.step, kernels.CompiledStep)
        got = [m.prefill(idx[:, :9], state)]
        got += [m.step(idx[:, t:t + 1], state).clone() for t in range(9, 24)]
    # float32: the recurrent and the parallel forms sum in different orders (1e-5 on O(1) logits)
    torch.testing.assert_close(torch.stack(got, 1), full[:, 8:], rtol=0, atol=1e-5, msg=to_edit(m))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]  # one graph, every position
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_chunked_cross_entropy_equals_cross_entropy_in_chunks(monkeypatch, dtype, tol):
    """Several chunks (CE_CHUNK lowered to 64 rows for 300), ignored targets (-1): the loss and the
    gradients of x and of the weight equal F.cross_entropy's on the full logits (float64: to
    rounding, 1e-12; float32: 1e-5 relative, sums in another order)."""
    monkeypatch.setattr(cross_entropy, "CE_CHUNK", 64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(37, 8, dtype=dtype, generator=g, requires_grad=True)
    targets = torch.randint(0, 37, (300,), generator=g)
    targets[::7] = -1
    loss = cross_entropy.chunked_cross_entropy(x, w, targets)
    grads = torch.autograd.grad(2.5 * loss, (x, w))
    ref = F.cross_entropy(x @ w.t(), targets, ignore_index=-1)
    ref_grads = torch.autograd.grad(2.5 * ref, (x, w))
    torch.testing.assert_close(loss, ref, rtol=tol, atol=tol)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("chunked", [False, True], ids=["reference", "chunked"])
def test_gpt_loss_is_the_cross_entropy_of_its_logits_under_bf16_autocast(monkeypatch, chunked):
    """The model's loss (model.GPT.loss, or the chunked one that kernels.use puts in: bf16 logits,
    fp32 softmax) against F.cross_entropy on the bf16 logits of the forward without targets, cast
    to fp32: 1e-3 (bf16 logits, sums in another order). kernels.use puts model.GPT.loss back."""
    monkeypatch.setattr(cross_entropy, "CE_CHUNK", 16)  # several chunks of the 72 tokens
    m = kernels.use(kernels.use(tiny("tssa").train(), "torch", chunked_loss=not chunked), "torch", chunked_loss=chunked)
    assert m.loss.__func__ is (cross_entropy.gpt_loss if chunked else GPT.loss)
    idx = torch.randint(0, 31, (3, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = m(idx, idx)
        logits, _ = m(idx)
    ref = F.cross_entropy(logits.float().view(-1, 31), idx.view(-1))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
