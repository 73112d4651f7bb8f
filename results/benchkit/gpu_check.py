"""
results/benchkit/gpu_check.py: the report's sections gpu_check_accuracy and gpu_check_determinism:
`python -m kernels.gpu_check MODE <json>` run as a subprocess (on a CUDA GPU only), its JSON
kept as it wrote it and its rows recorded; a failure is a row holding the end of its output.
"""

import json
import os
import subprocess
import sys

from results.benchkit.part import why_not
from nanotost import REPO



def section_gpu_check(S, mode):
    """python -m kernels.gpu_check MODE <json>: its JSON is kept as it is written (rows: one per
    accuracy row, or one for determinism); a failure is a row with the end of its output."""
    why = None if S.cuda else why_not(S, "gpu_check")
    if why:
        S.row(mode=mode, status="skipped", reason=why)
        return
    out = S.path + f".{mode}.json"  # beside the part file (a temporary folder), not in the report's
    try:
        done = subprocess.run([sys.executable, "-m", "kernels.gpu_check", mode, out], cwd=REPO, capture_output=True,
                              text=True, timeout=max(5.0, S.time_left() - 5))
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-1500:]
        S.row(mode=mode, status="failed", reason="kernels/gpu_check.py did not finish in the section's time",
              output_tail=tail.decode(errors="replace") if isinstance(tail, bytes) else tail)
        return
    if done.returncode != 0 or not os.path.isfile(out):
        S.row(mode=mode, status="failed", reason=f"kernels/gpu_check.py exited with {done.returncode}",
              output_tail=(done.stdout + done.stderr)[-1500:])
        return
    with open(out) as f:
        result = json.load(f)
    S.data["result"] = result
    rows = result.get("result")
    for r in (rows if isinstance(rows, list) else [rows]):
        S.row(**{"mode": mode, **(r if isinstance(r, dict) else dict(value=r))})
