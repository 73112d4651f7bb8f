"""
tssa_impl="auto": the Triton kernels where they can serve, model.py's reference elsewhere.

On the first TSSA call on a device, the Triton kernels are tried there: they must import and
agree with the reference on a small check (the causal and non-causal forward with their
gradients, and one decoding step). They pass on a CUDA GPU with a working Triton; the rest of
the run then uses them (kernels/fused.py, as tssa_impl="triton"). Anywhere else (a CPU, no
Triton, a compile error, an answer that differs) the reference runs, with one warning that
says why. The GPU configs (config/tost_owt*.py) use it: the same file trains on any machine.

    model = kernels.use(GPT(config), "auto")      # train.py --tssa_impl=auto
    python -m pytest -q tests/test_auto.py
"""

import warnings

import torch

import model
from kernels.fused import failure_of, fused_ops

CHECK_ON_CPU = False  # tests: run the check on the CPU too (the kernels under TRITON_INTERPRET=1)
CHECK_TOLERANCE = 1e-3  # fp32 sums in another order differ ~1e-6 relative; a wrong kernel by O(1)


def differences(device, impl="triton"):
    """The largest difference, relative to the reference's largest value, between the fused
    kernels of impl and model.py's operators as they are now (looked up by name: a fork's edit
    shows) over each output and gradient of a small fp32 case on device."""
    gen = torch.Generator().manual_seed(0)
    B, H, T, p = 2, 3, 40, 8  # T over a chunk boundary of the kernels at their smallest chunk
    w0 = torch.randn(B, H, T, p, generator=gen)
    temp0, bias0 = torch.rand(H, generator=gen) + 0.5, 0.1 * torch.randn(H, T + 8, generator=gen)
    g = torch.randn(B, H, T, p, generator=gen).to(device)
    fused, reference = fused_ops(impl), model.TSSAOps(model.tssa, model.causal_tssa, model.causal_tssa_step)
    worst = {}
    for name in ("causal_tssa", "tssa"):
        got = []
        for ops in (reference, fused):
            w, temp, bias = (t.to(device).requires_grad_() for t in (w0, temp0, bias0))
            out = ops.causal_tssa(w, temp, bias) if name == "causal_tssa" else ops.tssa(w, temp)
            inputs = (w, temp, bias) if name == "causal_tssa" else (w, temp)
            got.append((out, *torch.autograd.grad(out, inputs, g)))
        for i, (ref, new) in enumerate(zip(*got)):
            worst[f"{name}[{i}]"] = ((new - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    outs = []
    for ops in (reference, fused):
        state = model.TSSAState.zeros(B, H, p, device)
        with torch.no_grad():
            for t in range(3):  # three tokens: the state's sums are read back as well as written
                out = ops.causal_tssa_step(w0[:, :, t].to(device), temp0.to(device), bias0[:, t].to(device), state)
        outs.append(out)
    worst["causal_tssa_step"] = ((outs[1] - outs[0]).abs().max() / outs[0].abs().max()).item()
    return worst


def triton_refusal(device_type):
    """None where the Triton kernels pass the check on device_type, else why not (one line)."""
    if device_type != "cuda" and not (CHECK_ON_CPU and device_type == "cpu"):
        return f"the Triton kernels run on CUDA, this is a {device_type} device"
    with warnings.catch_warnings(record=True) as caught:  # kernels/fused.py's warning is the cause
        warnings.simplefilter("always")
        try:
            worst = differences(device_type)
        except Exception as e:  # noqa: BLE001 (no Triton, a compile error, a launch error: all say why)
            return f"the Triton check raised {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    fell_back = [str(w.message).split("; running")[0] for w in caught if "tssa_impl='triton'" in str(w.message)]
    failure = failure_of("triton")  # off since an earlier call of this process (its warning given then)
    if fell_back or failure:
        return fell_back[0] if fell_back else f"the Triton kernels are off in this process: {failure}"
    name, diff = max(worst.items(), key=lambda kv: kv[1])
    if not diff <= CHECK_TOLERANCE:  # (nan fails too)
        return f"the Triton kernels differ from the reference: {name} by {diff:.2g} of its largest value"
    return None


_REFUSALS = {}  # device type -> the check's answer, asked once per process


@torch.compiler.assume_constant_result  # asked once while Dynamo traces, then a constant of the graph
def triton_picked(device_type):
    """Whether "auto" runs the Triton kernels on device_type (checked on the first call)."""
    if device_type not in _REFUSALS:
        cause = _REFUSALS[device_type] = triton_refusal(device_type)
        if cause:
            warnings.warn(f"tssa_impl='auto': {cause}; running model.py's reference maths", RuntimeWarning,
                          stacklevel=5)
    return _REFUSALS[device_type] is None


def chosen(device):
    """The operators "auto" runs on tensors of this device."""
    return fused_ops("triton") if triton_picked(device.type) else model.REFERENCE_OPS


def tssa(w, temp, return_pi=False, mask=None, pi_mode="softmax"):
    return chosen(w.device).tssa(w, temp, return_pi, mask, pi_mode)


def causal_tssa(w, temp, pos_bias, return_pi=False, pi_mode="softmax", state=None):
    return chosen(w.device).causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state)


def causal_tssa_step(w_t, temp, bias_t, state, pi_mode="softmax"):
    return chosen(w_t.device).causal_tssa_step(w_t, temp, bias_t, state, pi_mode)


AUTO_OPS = model.TSSAOps(tssa, causal_tssa, causal_tssa_step)
