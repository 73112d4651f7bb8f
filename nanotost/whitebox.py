"""
What the two white-box tools share (vit_inspect.py for images, lm_inspect.py for text; MATH.md §7):
R_var of a TSSA layer's tokens before and after its step, the figure of it layer by layer, the
layers a person names on the command line, a figure as PNG bytes, writing what they drew. A
library: no script here.
"""

import io
import json
import os
import re

import torch

from model import compression_objective, split_heads
from nanotost import atomic, cli, outputs, plots

plt = plots.pyplot()  # (files only; a `$` in a title is a dollar sign)
from matplotlib.ticker import FormatStrFormatter, MaxNLocator  # noqa: E402


def layer_numbers(text, example="1,6,12"):
    """"1,6,12" -> [1, 6, 12] ("" -> []): layer numbers, each once (cli.parse_list); anything else
    is one line that shows the form."""
    return cli.parse_list("layers", text, int, what=f"layer numbers (like '{example}')") if text.strip() else []


@torch.no_grad()
def step_rvar(block, maps):
    """R_var (B,) of a block's TSSA tokens before and after its step, from the record of
    TSSA.forward (z, w = U^T z, pi, out): before = compression_objective(w, Pi), after = the same
    on w_proj(z + attn_scale(out)), the tokens moved by the step seen through the same U and Pi."""
    before = compression_objective(maps["w"], maps["pi"])
    w_after = split_heads(block.attn.w_proj(maps["z"] + block.attn_scale(maps["out"])), block.attn.n_head)  # same U
    return before, compression_objective(w_after, maps["pi"])  # same Pi


def png_bytes(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def rvar_figure(rvar, layers, over, title):
    """The paper's Figure 4a: R_var after (solid) and before (dotted) each layer's step, for the
    train and val splits of rvar ({split: {"before": [...], "after": [...]}}), at layer numbers
    `layers`; and after - before per layer. over: what each mean is over ("500 images")."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for split, colour, offset in (("train", "tab:blue", -0.2), ("val", "tab:orange", 0.2)):
        r = rvar[split]
        left.plot(layers, r["after"], "-o", color=colour, label=f"{split}, after the step")
        left.plot(layers, r["before"], ":", color=colour, label=f"{split}, before the step")
        right.bar([l + offset for l in layers], [a - b for a, b in zip(r["after"], r["before"])], width=0.4,
                  color=colour, label=split)
    right.axhline(0, color="black", linewidth=0.8)
    left.set(title="R_var by layer", xlabel="TSSA layer", ylabel=f"R_var (mean of {over})")
    right.set(title="after - before (below 0: the step lowered R_var)", xlabel="TSSA layer", ylabel="change in R_var")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return png_bytes(fig)


def claim_outputs(out, elsewhere, tool):
    """The inspection folder, claimed before any work (outputs.claim_set): one run at a time, a folder
    of this tool's earlier inspection or a new one (never one of the user's files), and a place
    where the new set can replace the old."""
    return outputs.claim_set(out, elsewhere, tool, legacy=lambda folder: earlier_inspection(folder, tool))


# the names each tool gives (and ever gave) the files of an inspection: its page, its pictures
INSPECTION_FILES = {"lm_inspect.py": re.compile(r"index\.html|inspect\.json|pi_tokens\.png|rvar\.png"),
                    "vit_inspect.py": re.compile(r"inspect\.json|rvar\.png|(pi|cls_attn)_\d+\.png")}


def earlier_inspection(folder, tool):
    """The files of an inspection written before sets had manifests with digests: those its
    inspect.json lists, and inspect.json itself (nothing when there is no such inspect.json),
    each of a name `tool` gives its files (INSPECTION_FILES: a list naming a file of the user's
    does not make it the tool's)."""
    try:
        with open(os.path.join(folder, "inspect.json"), encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return set()
    if not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        return set()
    return {n for n in {"inspect.json", *files} if INSPECTION_FILES[tool].fullmatch(n)}


def write_outputs(out_set, files, report):
    """files ({name: bytes}) and the report as inspect.json: the folder's whole new content, swapped
    in as one unit (outputs.OutputSet), never with a NaN or infinite figure (one line: nothing is
    written). Returns whether it replaced an earlier inspection."""
    atomic.check_finite_result(report, "the inspection", "the model's weights or the text make NaN; inspect a "
                                                         "checkpoint from before its run broke")
    return out_set.replace({**files, "inspect.json": json.dumps(report, indent=1) + "\n"})
