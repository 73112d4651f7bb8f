"""
A decoding step replayed as a CUDA graph: model.GPT.step has fixed shapes, writes its states
in place and keeps the position on the device, so one recording serves every later token.

    model.generate(idx, 100, stepper=kernels.CapturedStep)   # sample.py --decode=auto on CUDA
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

    def __call__(self, tok):  # tok (B, 1) -> logits (B, V), a buffer the next call overwrites
        if not tok.is_cuda:
            return self.model.step(tok, self.state)
        amp = torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"),
                             enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False)
        if not self.warm:
            self.warm = True
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), amp:
                logits = self.model.step(tok, self.state)
            torch.cuda.current_stream().wait_stream(side)
            return logits
        if self.graph is None:
            self.tok, self.graph = tok.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), amp:
                self.logits = self.model.step(self.tok, self.state)
        self.tok.copy_(tok)
        self.graph.replay()
        return self.logits
