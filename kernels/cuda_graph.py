"""
A decoding step replayed as a CUDA graph: model.GPT.step has fixed shapes, writes its states
in place and keeps the position on the device, so one recording serves every later token.
CapturedStep records the step op by op (hundreds of small kernels: ToST-Base launches ~430 a
token); CompiledStep records the step torch.compile made of it (Inductor fuses the elementwise
work of each block into a few kernels), for ToST and for GPT-2 alike. Both are GPT.decode's
steppers: a factory stepper(model, state) whose result maps tok (B, 1) to logits (B, V).

    model.generate(idx, 100, stepper=kernels.CapturedStep)   # sample.py --decode=auto on CUDA
    model.generate(idx, 100, stepper=kernels.CompiledStep)   # compiled first (tens of seconds)
"""

import torch


class CapturedStep:
    """GPT.step recorded once as a CUDA graph and replayed for every token: one launch of the
    whole step instead of one per operation. The states are written in place and the position
    is a device tensor, so one recording serves every position (and a new prompt, prefilled
    into the same buffers). The first call runs eagerly on a side stream (warm-up: cuBLAS
    handles, lazy allocations); the second records, and every call replays. Autocast's cache
    of cast weights is off while recording: the casts are part of the graph, so it never
    reads copies that autocast frees when its block ends. Off CUDA, every call is model.step.
    Use it as GPT.decode's stepper: model.generate(idx, n, stepper=kernels.CapturedStep)."""

    def __init__(self, model, state):
        self.model, self.state, self.graph, self.warm = model, state, None, False
        self.run = model.step  # (tok, state) -> logits: what is recorded

    def __call__(self, tok):  # tok (B, 1) -> logits (B, V), a buffer the next call overwrites
        if not tok.is_cuda:
            return self.run(tok, self.state)
        amp = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                             enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        if not self.warm:
            self.warm = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), amp:
                logits = self.run(tok, self.state)
            torch.cuda.current_stream().wait_stream(side)
            return logits
        if self.graph is None:
            self.tok, self.graph = tok.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), amp:
                self.logits = self.run(self.tok, self.state)
        self.tok.copy_(tok)
        self.graph.replay()
        return self.logits


class CompiledStep(CapturedStep):
    """GPT.step compiled by torch.compile (fixed shapes), then recorded and replayed as
    CapturedStep does on CUDA; off CUDA, every call runs the compiled step. The first call
    compiles (on CUDA inside the warm-up). With model.py's operators the step is one graph; a
    fused decoding kernel (tssa_impl "triton", "cpu") runs between graphs, and on CUDA the one
    recording holds both. backend: torch.compile's ("inductor"; the tests use "aot_eager",
    which traces the same graph without building kernels)."""

    def __init__(self, model, state, backend="inductor"):
        super().__init__(model, state)
        self.run = torch.compile(model.step, backend=backend, dynamic=False)
