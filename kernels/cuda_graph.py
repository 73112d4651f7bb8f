"""
A decoding step replayed as a CUDA graph: model.GPT.step has fixed shapes, writes its states
in place and keeps the position on the device, so one recording serves every later token.
CapturedStep records the step op by op (hundreds of small kernels: ToST-Base launches ~430 a
token); CompiledStep records the step torch.compile made of it (Inductor fuses the elementwise
work of each block into a few kernels), for ToST and for GPT-2 alike. capture_steps puts
either in the place of a model's step, so GPT.generate runs it unchanged.

    kernels.capture_steps(model)                  # sample.py --cuda_graph=auto on CUDA
    kernels.capture_steps(model, compiled=True)   # compiled first (tens of seconds): --cuda_graph=compiled
    kernels.capture_steps(model, **CAPTURES["autotuned"])  # Inductor's autotuned kernels: minutes first
    model.generate(idx, 100)                      # each step after the first two: one replay
"""

import torch

# how sample.py's --cuda_graph records the step (capture_steps' arguments); "off": not at all
CAPTURES = {"auto": {}, "compiled": dict(compiled=True),
            "autotuned": dict(compiled=True, mode="max-autotune-no-cudagraphs")}  # (the recording is ours)


class CapturedStep:
    """A GPT's step (tok, state) -> logits recorded once as a CUDA graph per decoding state and
    replayed for every token: one launch of the whole step instead of one per operation. The
    states are written in place and the position is a device tensor, so one recording serves
    every position (and a new prompt, prefilled into the same buffers); a new state is recorded
    anew. The first call on a state runs eagerly on a side stream (warm-up: cuBLAS handles, lazy
    allocations); the second records, and every call replays. Autocast's cache of cast weights
    is off while recording: the casts are part of the graph, so it never reads copies that
    autocast frees when its block ends. Off CUDA, every call is the step itself."""

    def __init__(self, step):
        self.run, self.state, self.graph, self.warm = step, None, None, False

    def __call__(self, tok, state):  # tok (B, 1) -> logits (B, V), a buffer the next call overwrites
        if not tok.is_cuda:
            return self.run(tok, state)
        if state is not self.state:  # another decoding: its own buffers, its own recording
            self.state, self.graph, self.warm = state, None, False
        amp = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                             enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        if not self.warm:
            self.warm = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), amp:
                logits = self.run(tok, state)
            torch.cuda.current_stream().wait_stream(side)
            return logits
        if self.graph is None:
            self.tok, self.graph = tok.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), amp:
                self.logits = self.run(self.tok, state)
        self.tok.copy_(tok)
        self.graph.replay()
        return self.logits


class CompiledStep(CapturedStep):
    """The step compiled by torch.compile (fixed shapes), then recorded and replayed as
    CapturedStep does on CUDA; off CUDA, every call runs the compiled step. The first call
    compiles (on CUDA inside the warm-up). With model.py's operators the step is one graph; a
    fused decoding kernel (tssa_impl "triton", "cpu") runs between graphs, and on CUDA the one
    recording holds both. backend: torch.compile's ("inductor"; the tests use "aot_eager",
    which traces the same graph without building kernels); mode: torch.compile's (None: its
    default; "max-autotune-no-cudagraphs": Inductor times its kernel choices, fewer and faster
    kernels a token, and leaves the recording to this class)."""

    def __init__(self, step, backend="inductor", mode=None):
        super().__init__(torch.compile(step, backend=backend, dynamic=False, mode=mode))


def capture_steps(model, compiled=False, backend="inductor", mode=None):
    """Make model.step (a model.GPT's) a CapturedStep of itself, or a CompiledStep (compiled in
    torch.compile's `mode`): GPT.generate then replays each token's step as a CUDA graph on
    CUDA. Returns the model."""
    step = model.step  # the bound method, kept before the attribute hides it
    model.step = CompiledStep(step, backend, mode) if compiled else CapturedStep(step)
    return model
