"""
A decoding step replayed as a CUDA graph: model.GPT.step has fixed shapes, writes its states
in place and keeps the position on the device, so one recording serves every later token.

    kernels.capture_steps(model)       # sample.py --cuda_graph=auto on CUDA
    model.generate(idx, 100)           # every step after the first two is one graph replay
"""

import torch


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
        self.step, self.state, self.graph, self.warm = step, None, None, False

    def __call__(self, tok, state):  # tok (B, 1) -> logits (B, V), a buffer the next call overwrites
        if not tok.is_cuda:
            return self.step(tok, state)
        if state is not self.state:  # another decoding: its own buffers, its own recording
            self.state, self.graph, self.warm = state, None, False
        amp = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                             enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        if not self.warm:
            self.warm = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), amp:
                logits = self.step(tok, state)
            torch.cuda.current_stream().wait_stream(side)
            return logits
        if self.graph is None:
            self.tok, self.graph = tok.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), amp:
                self.logits = self.step(self.tok, state)
        self.tok.copy_(tok)
        self.graph.replay()
        return self.logits


def capture_steps(model):
    """Make model.step (a model.GPT's) a CapturedStep of itself: GPT.generate then replays each
    token's step as a CUDA graph on CUDA, unchanged elsewhere. Returns the model."""
    model.step = CapturedStep(model.step)  # the bound method, kept before the attribute hides it
    return model
