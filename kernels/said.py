"""
The one line every warning of the kernels package is (warn): attributed to the line that ran the
model, the first caller outside torch, model.py and this package (a script's line, a notebook's
cell), without the source line. Its own module, below every other of the package, so that a
kernel's host code can warn without importing the autograd glue (kernels/fused.py) that imports it.
"""

import os
import sys
import warnings

import torch

import model

INSIDE = (os.path.join(os.path.dirname(torch.__file__), ""), os.path.abspath(model.__file__),  # what warn looks
          os.path.join(os.path.dirname(os.path.abspath(__file__)), ""))  # past: torch/, model.py, kernels/


def warn(message):
    """warnings.warn(message, RuntimeWarning) as one line, attributed to the line that ran the model:
    the first caller outside torch, model.py and this package (a script's line, a notebook's cell)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(INSIDE):
        frame, level = frame.f_back, level + 1
    shown = warnings.formatwarning
    warnings.formatwarning = lambda text, category, filename, lineno, line=None: (
        f"{filename}:{lineno}: {category.__name__}: {text}\n")  # (the source line left out)
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=level)
    finally:
        warnings.formatwarning = shown
