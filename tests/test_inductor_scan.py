"""
Inductor's CUDA code for the reference's causal TSSA, generated on a machine without a GPU:
model.causal_tssa's cumulative sums (model.prefix_sum) must never reach Inductor's split-scan
path, which torch 2.11 (the GPU image's version) fails to build. Inductor splits a scan longer
than 32 elements over fewer than 2 * 32 rows per SM (ir.Reduction.num_splits): B H p = 768
rows at B = 1, H = 12, p = 64 against 8,448 for the 132 SMs of an H100.

How it runs without a GPU: the training step (forward and the gradients of w, temp and
pos_bias) is traced to ATen ops on fake CPU tensors (the autograd engine needs a real device),
its device arguments are moved to cuda:0, it is traced again on fake CUDA tensors, and
Inductor lowers it and writes its Triton source while the CUDA device queries answer as an
H100 (132 SMs, sm_90). Nothing is compiled or run; the source text is what is checked.

    python -m pytest -q tests/test_inductor_scan.py
"""

import contextlib
import os
import sys
import types
from unittest import mock

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import model  # noqa: E402

pytest.importorskip("triton")  # Inductor writes Triton source only where Triton is installed

B, H, T, P = 1, 12, 16384, 64  # the config/tost_owt_16k.py shape that failed on the H200 (B = 1: fewest rows)
H100 = types.SimpleNamespace(name="an H100 (no GPU here)", multi_processor_count=132, major=9, minor=0,
                             regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                             max_threads_per_block=1024, warp_size=32)
SPLIT_SCAN = "triton_heuristics.split_scan("  # the decorator of every split-scan kernel Inductor writes


def train_step(w, temp, pos_bias, g):
    """The reference's forward and the gradients a training step takes through it."""
    out = model.causal_tssa(w, temp, pos_bias)
    return torch.autograd.grad(out, (w, temp, pos_bias), g)


def plain_cumsum(w, temp, pos_bias, g):
    """One cumsum over T, as causal_tssa's sums were before model.prefix_sum."""
    return w.float().square().cumsum(2)


def step_inputs(device):  # w (B, H, T, P) bf16, temp (H,), pos_bias (H, T), g (B, H, T, P)
    w = torch.empty(B, H, T, P, device=device, dtype=torch.bfloat16, requires_grad=True)
    temp = torch.empty(H, device=device, requires_grad=True)
    pos_bias = torch.empty(H, T, device=device, requires_grad=True)
    return [w, temp, pos_bias, torch.empty(B, H, T, P, device=device, dtype=torch.bfloat16)]


def as_an_h100():
    """The CUDA queries Inductor makes while lowering and writing code, answered as an H100."""
    from torch._dynamo.device_interface import CudaInterface
    patches = [mock.patch.object(CudaInterface, "get_device_properties", staticmethod(lambda device=None: H100)),
               mock.patch.object(CudaInterface, "get_compute_capability", staticmethod(lambda device=None: 90)),
               mock.patch.object(CudaInterface, "is_available", staticmethod(lambda: True)),
               mock.patch("torch._inductor.scheduler.has_triton", lambda: True),
               mock.patch("torch.cuda.get_device_properties", lambda device=None: H100),
               mock.patch("torch.cuda.get_device_capability", lambda device=None: (9, 0)),
               mock.patch("torch.cuda.current_device", lambda: 0),
               mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "no GPU")]
    stack = contextlib.ExitStack()
    for p in patches:
        stack.enter_context(p)
    return stack


def compiling():
    """torch.compile's view of the model: Dynamo answers torch.compiler.is_compiling() with True
    while it traces (the nested scans of model.prefix_sum); make_fx alone would not."""
    return mock.patch("torch.compiler.is_compiling", lambda: True)


def inductor_cuda_source(fn):
    """The Python + Triton source Inductor writes for fn(*step_inputs) on an H100."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.utils import fresh_cache
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode(), compiling():  # ATen ops (backward included) traced where autograd runs: the CPU
        graph = make_fx(fn, decomposition_table=select_decomp_table())(*step_inputs("cpu"))
    for node in graph.graph.nodes:  # tensors the graph creates (zeros, pads) go to the GPU too
        if "device" in node.kwargs:
            node.kwargs = {**node.kwargs, "device": torch.device("cuda", 0)}
    graph.recompile()
    with as_an_h100(), fresh_cache():
        fake = FakeTensorMode()
        with fake:
            inputs = [x.detach() for x in step_inputs("cuda")]
            graph = make_fx(graph)(*inputs)  # the same ops, every tensor on cuda:0
        with V.set_fake_mode(fake), DebugContext():
            lowering = GraphLowering(graph, example_inputs=inputs)
            with V.set_graph_handler(lowering):
                lowering.run(*inputs)
                code = lowering.codegen()[0]
    return getattr(code, "value", code)


def test_the_reference_training_step_has_no_split_scan_kernel_on_an_h100():
    source = inductor_cuda_source(train_step)
    assert "device='cuda'" in source.replace('"', "'") and "multi_processor_count=132" in source
    assert source.count("tl.associative_scan") >= 4  # the sums are there, as scans (3 forward, more backward)
    assert SPLIT_SCAN not in source


def test_a_plain_cumsum_of_the_same_shape_gets_a_split_scan_kernel():
    # the control: the check above can fail, and the SM count reaches Inductor's decision
    assert SPLIT_SCAN in inductor_cuda_source(plain_cumsum)


def test_prefix_sum_equals_cumsum_in_float64():
    # the nested scans (as torch.compile traces them), 1e-12 relative: float64 rounding over
    # <= 16K positive terms, summed in another order
    with compiling():
        for T_ in (1, 31, 32, 33, 1000, 1025, 16384):
            x = torch.rand(2, 3, T_, 4, dtype=torch.float64)
            torch.testing.assert_close(model.prefix_sum(x), x.cumsum(2), rtol=1e-12, atol=0)
        x = torch.randn(1, 2, 100, 3, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(model.prefix_sum, (x,))
