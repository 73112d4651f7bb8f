"""
Seeing inside a trained ToST language model (MATH.md §7): which tokens each head takes (Pi), how
each head's running statistic s moves along a text, and whether each layer's step lowers R_var,
as one page a student opens in a browser.

    python lm_inspect.py --out_dir=out-pydocs-char-tost                       # a window of its val split
    python lm_inspect.py --out_dir=out-pydocs-char-tost --text="def main():" --layers=1,6
    python lm_inspect.py --out_dir=out-pydocs-char-tost --text=FILE:notes.txt
    python lm_inspect.py --init_from=<you>/pydocs-char-tost --data_dir=data   # a model export.py wrote

For any train.py checkpoint with TSSA blocks (the short convolution and the hybrid included: its
softmax blocks are listed as skipped; a fork's TSSA subclass too, which a warning names where its
output is not built from model.py's s); a softmax or linear-attention run is refused. Writes into
<out_dir>/inspect/ (with --init_from: <folder>-inspect beside the model's folder, or <name>-inspect
here for a Hub id; --page_dir elsewhere) as one unit: the folder is swapped whole for the new set,
so a reader sees an earlier inspection or this one, never a mix (outputs.claim_set; only the files of
an earlier inspection are replaced, and a folder holding anything else is refused before any work):
  index.html    one self-contained page (nothing loaded from anywhere): the text, each token
                coloured by its dominant head in the chosen layer (a switch changes layers), the
                full Pi of a token on hover or keyboard focus, a legend; per layer what each head
                takes and its running statistic along the text; R_var before and after each step
  pi_tokens.png Pi of every token of the text (columns) in each head (rows), per chosen layer
  rvar.png      R_var before and after each TSSA layer's step, mean over n_windows train and
                n_windows val windows of block_size tokens (as vit_inspect.py draws it)
  inspect.json  every number drawn
and prints per layer the mean entropy of Pi against log H (log H: no grouping), R_var before and
after, and per head its share of the tokens and the tokens it takes most.

What is measured. For TSSA block l, block(x, record=maps) gives z (the tokens TSSA receives: ln_1
of the stream, after the short convolution if any), w = U^T z per head, Pi (B, H, T) and out =
c_proj(TSSA(w)). The running statistic of head k at token j is the prefix second moment
s_k(j) = sum_{t<=j} Pi_kt w_t^2 / sum_{t<=j} Pi_kt (p features; the page draws their mean).
R_var "before" is compression_objective(w, Pi) over a whole window (the prefix objective at its
last token), "after" the same on w_proj(z + attn_scale(out)) with the same Pi: vit_inspect.py's measure.
What each head takes is counted over the n_windows val windows: the share of tokens whose
largest Pi is that head's, its most frequent tokens, its mean Pi on letters, digits, spaces and
punctuation (a BPE token counts by its first character that is not a space).
"""

import html
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

import torch
from tqdm import tqdm

import kernels
from model import TSSA
from nanotost import atomic, cli, devices, forks, hub, lists, loading, outputs, plots
from nanotost import textdata as td
from nanotost.whitebox import claim_outputs, layer_numbers, png_bytes, rvar_figure, step_rvar, write_outputs

plt = plots.pyplot()  # (files only; a `$` in a path or a token is a dollar sign)
from matplotlib.colors import hsv_to_rgb  # noqa: E402

# -----------------------------------------------------------------------------
# settings
out_dir = "out"  # the train.py run to inspect: the folder holding ckpt.pt
ckpt_path = ""  # or the checkpoint file itself
init_from = ""  # or a model export.py wrote: its folder, or its Hugging Face Hub id
text = ""  # the text to show; "" = a window of block_size tokens of the val split; "FILE:path" reads a file
val_start = 0  # where in val.bin that window begins (text="")
layers = ""  # 1-based TSSA layers to draw, e.g. "1,6"; "" = every TSSA layer
n_windows = 64  # windows of block_size tokens from train and from val: R_var, and what each head takes (val)
batch_size = 16  # windows per forward
top_tokens = 5  # most frequent tokens listed per head
data_dir = ""  # "" = the run's data_dir
page_dir = ""  # "" = <checkpoint folder>/inspect (--init_from: beside the model's folder)
screenshot = ""  # a .png path: also draw the page as it opens, with headless Chromium (installed apart)
device = "cpu"  # "auto", "cpu", "cuda", "cuda:1"
num_threads = 0  # torch CPU threads (0: the training run's setting, else the machine's free cores)
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
# -----------------------------------------------------------------------------
DEFAULTS = cli.config_defaults(globals())
CLASSES = ("letters", "digits", "spaces", "punctuation")
RECORD = ("z", "w", "pi", "out")  # the maps of each TSSA block the page draws (TSSA.forward's record)


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before anything is read or built."""
    cli.check(cfg, at_least_1=("n_windows", "batch_size", "top_tokens"), non_negative=("val_start",),
              workers=("num_threads",), choices={"tssa_impl": kernels.IMPLS})
    cli.require(cfg.out_dir or cfg.ckpt_path or cfg.init_from,
                "give the run to inspect: --out_dir=<a train.py out_dir>")
    layer_numbers(cfg.layers, "1,6")
    cli.require(not cfg.screenshot or cfg.screenshot.lower().endswith(".png"),
                f"screenshot={cfg.screenshot!r}: give a .png path, e.g. --screenshot=page.png")
    cli.require(not cfg.screenshot or browser(), "--screenshot needs Chromium (e.g. apt-get install chromium), and "
                                               "none was found on PATH: install it, or leave --screenshot out")


# -----------------------------------------------------------------------------
# the maps of every layer, and the numbers drawn from them


@torch.no_grad()
def recorded_forward(model, idx):
    """GPT.forward with each block's maps kept: idx (B, T) -> (logits (B, T, V), a list with one
    entry per block: TSSA.forward's record (z, w, pi, out), or None for a softmax block)."""
    T = idx.shape[1]
    x = model.drop(model.wte(idx) + model.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
    layer_maps = []
    for i, block in enumerate(model.blocks):
        maps = {}
        x = block(x, record=maps)
        if isinstance(block.attn, TSSA) and not all(isinstance(maps.get(k), torch.Tensor) for k in RECORD):
            raise cli.UserError(f"blocks.{i}.attn ({type(block.attn).__name__}) records {sorted(maps) or 'nothing'}, "
                                f"not the maps {', '.join(RECORD)} that TSSA.forward records and lm_inspect.py draws: "
                                "record them in its forward (record.update), as TSSA.forward does")
        layer_maps.append(maps if isinstance(block.attn, TSSA) else None)
    return model.lm_head(model.ln_f(x)), layer_maps


def entropy(pi):
    """Entropy over heads of pi (..., H, T) -> (..., T), in nats; log H means no grouping."""
    p = pi.double().clamp_min(1e-30)
    return -(p * p.log()).sum(-2)


@torch.no_grad()
def rvar_before_after(model, layer_maps):
    """R_var before and after each TSSA block's step, each (B, n_tssa), from recorded_forward's maps."""
    before, after = zip(*(step_rvar(block, m) for block, m in zip(model.blocks, layer_maps) if m is not None))
    return torch.stack(before, 1), torch.stack(after, 1)  # (B, n_tssa) each


def token_class(piece):
    """letters, digits, spaces or punctuation: a token's first character that is not a space."""
    stripped = piece.strip()
    if not stripped:
        return "spaces"
    return "letters" if stripped[0].isalpha() else "digits" if stripped[0].isdigit() else "punctuation"


def visible(piece):
    """A token as a reader can see it: a space, a newline and a tab drawn as symbols."""
    return piece.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5") or "\u2205"


def head_table(pi, pieces, top):
    """What each head takes, over tokens pi (N, H) with their texts pieces (N,): per head its
    share of the tokens (largest Pi), its most frequent tokens (share of the head's tokens, and of
    all tokens) and its mean Pi on each class of CLASSES (None for a class with no token)."""
    H, N = pi.shape[1], len(pieces)
    kinds = [token_class(p) for p in pieces]
    mean_pi = {}  # class -> (H,) mean Pi of its tokens
    for c in CLASSES:
        mask = torch.tensor([kind == c for kind in kinds], dtype=torch.bool)  # (N,)
        mean_pi[c] = pi[mask].double().mean(0).tolist() if mask.any() else None
    taken = [Counter() for _ in range(H)]  # per head: how often it holds each token's largest Pi
    for piece, k in zip(pieces, pi.argmax(1).tolist()):
        taken[k][piece] += 1
    overall = Counter(pieces)
    rows = []
    for k, mine in enumerate(taken):
        n_mine = sum(mine.values())
        rows.append({"head": k + 1, "share": n_mine / N,  # top: [token, share of the head's tokens, of all]
                     "top": [[p, n / n_mine, overall[p] / N] for p, n in mine.most_common(top)],
                     "mean_pi": {c: None if v is None else v[k] for c, v in mean_pi.items()}})
    return rows


@torch.no_grad()
def over_windows(model, folder, split, starts, T, cfg, meta, decode):
    """R_var before/after per TSSA layer (mean, share of windows lowered) over the windows of a
    split that begin at starts; for val also each TSSA layer's head table and mean entropy of Pi
    (over every token, and at each position)."""
    before, after, pis, ids = [], [], [], []
    for i in tqdm(range(0, len(starts), cfg.batch_size), desc=f"{split} windows", disable=None, leave=False):
        x, _ = td.read_batch(folder, split, starts[i:i + cfg.batch_size], T, cfg.device, meta)  # (b, T)
        _, layer_maps = recorded_forward(model, x)
        b, a = rvar_before_after(model, layer_maps)
        before.append(b.cpu().double()), after.append(a.cpu().double())
        pis.append([m["pi"].cpu() for m in layer_maps if m is not None])  # n_tssa x (b, H, T)
        ids.append(x.cpu())
    before, after = torch.cat(before), torch.cat(after)  # (n, n_tssa)
    result = {"starts": [int(s) for s in starts], "before": before.mean(0).tolist(), "after": after.mean(0).tolist(),
              "lowered": (after < before).double().mean(0).tolist()}
    if split == "val":
        pieces = [decode([t]) for t in torch.cat(ids).flatten().tolist()]  # (n * T,)
        per_layer = [torch.cat([p[l] for p in pis]) for l in range(len(pis[0]))]  # n_tssa x (n, H, T)
        result["heads"] = [head_table(p.permute(0, 2, 1).reshape(-1, p.shape[1]), pieces, cfg.top_tokens)
                           for p in per_layer]
        result["entropy"] = [float(entropy(p).mean()) for p in per_layer]
        result["entropy_by_position"] = [entropy(p).mean(0).tolist() for p in per_layer]  # n_tssa x (T,)
    return result


# -----------------------------------------------------------------------------
# figures (PNG bytes, written at the end)


def pi_tokens_figure(pieces, rows, row_layers, title):
    """Pi of each token (columns) in each head (rows), one panel per chosen layer; rows: (H, T) each."""
    H, T = rows[0].shape
    width = min(max(8.0, 0.12 * T + 2), 40.0)  # inches: a column per token, up to 4000 pixels
    fig, axes = plt.subplots(len(rows), 1, figsize=(width, max(2.6, 0.32 * H * len(rows) + 1.4)),
                             squeeze=False, layout="constrained")
    for ax, pi, layer in zip(axes[:, 0], rows, row_layers):
        im = ax.imshow(pi, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_yticks(range(H), [f"head {k + 1}" for k in range(H)], fontsize=7)
        ax.set_ylabel(f"layer {layer}")
        step = max(1, round(T / (8.5 * width)))  # a label per token while they fit (8.5 an inch at 6 points)
        ax.set_xticks(range(0, T, step), [visible(p) for p in pieces[::step]], fontsize=6, fontfamily="monospace")
    bar = fig.colorbar(im, ax=axes, shrink=0.9)
    bar.set_label("Pi (1/H: no grouping)")
    fig.suptitle(title, fontsize=10)
    return png_bytes(fig)


# -----------------------------------------------------------------------------
# the page: one HTML file, its style and script inline, its numbers as JSON inside it


def head_colours(H):
    """H colours (r, g, b) evenly spaced in hue, mid lightness: readable under dark text in a
    light theme and under light text in a dark one, as a translucent background."""
    colours = []
    for k in range(H):
        r, g, b = hsv_to_rgb((k / H, 0.75, 0.85))
        colours.append((round(255 * r), round(255 * g), round(255 * b)))
    return colours


def token_backgrounds(pi, colours):
    """pi (H, T) -> one CSS colour per token: its dominant head's, stronger the surer the Pi."""
    H = pi.shape[0]
    top, head = pi.max(0)
    alpha = 0.18 + 0.5 * ((top - 1 / H) / (1 - 1 / H)).clamp(0, 1)  # 1/H -> pale, 1 -> strong
    return [f"rgba({','.join(map(str, colours[k]))},{a:.2f})" for k, a in zip(head.tolist(), alpha.tolist())]


def sparkline(values, colour):
    """An inline SVG line of values (T,), scaled to its own range."""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    W, Hh, n = 240, 34, max(len(values) - 1, 1)
    xs = [2 + (W - 4) * i / n for i in range(len(values))]
    ys = [Hh - 2 - (Hh - 4) * (v - lo) / span for v in values]  # (SVG's y grows downwards)
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    return (f'<svg class="spark" width="{W}" height="{Hh}" viewBox="0 0 {W} {Hh}" role="img" '
            f'aria-label="from {values[0]:.3g} to {values[-1]:.3g}, range {lo:.3g} to {hi:.3g}">'
            f'<polyline fill="none" stroke="rgb{colour}" stroke-width="1.6" points="{points}"/></svg>'
            f'<br><span class="range">{values[0]:.3g} at the first token, {values[-1]:.3g} at the last; '
            f'{lo:.3g} to {hi:.3g}</span>')


PAGE_STYLE = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1d1f22; --muted: #5a5f66; --line: #c9ccd1; --panel: #f3f4f6; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #16181b; --fg: #e9eaec; --muted: #a6abb2; --line: #474b52; --panel: #22252a; }
}
body { background: var(--bg); color: var(--fg); font: 15px/1.45 system-ui, sans-serif; margin: 1.2em auto;
       max-width: 70em; padding: 0 1em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.4em; }
.muted { color: var(--muted); }
#layers label { margin-right: 0.8em; white-space: nowrap; }
#legend { display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.6em 0; }
.swatch { display: inline-block; width: 30px; height: 18px; vertical-align: middle; margin-right: 0.35em;
          border: 1px solid var(--line); }
#text { font: 17px/1.9 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; padding: 0.6em;
        border: 1px solid var(--line); background: var(--bg); }
.tok { border-radius: 2px; }
.tok:focus { outline: 2px solid var(--fg); outline-offset: 1px; }
#info { min-height: 3.2em; background: var(--panel); padding: 0.5em 0.8em; margin: 0.6em 0; }
.bar { display: inline-block; height: 0.8em; vertical-align: middle; }
table { border-collapse: collapse; margin: 0.4em 0; }
th, td { border-bottom: 1px solid var(--line); padding: 0.2em 0.6em; text-align: left; vertical-align: middle; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.range { color: var(--muted); font-size: 0.8em; }
.nowrap { white-space: nowrap; }
code, .piece { font-family: ui-monospace, monospace; }
"""

PAGE_SCRIPT = """
const D = JSON.parse(document.getElementById("data").textContent);
const tokens = Array.from(document.querySelectorAll("#text .tok"));
let shown = 0;
function show(li) {
  shown = li;
  if (document.getElementById("info").innerHTML) explain(Number(document.body.dataset.token || 0));
  tokens.forEach((t, i) => { t.style.backgroundColor = D.layers[li].background[i];
                             t.dataset.head = D.layers[li].dominant[i] + 1; });
  document.querySelectorAll(".layer").forEach(s => { s.hidden = s.dataset.layer != D.layers[li].layer; });
  document.getElementById("layer-" + D.layers[li].layer).checked = true;
  document.body.dataset.layer = D.layers[li].layer;
}
function bar(p, k) {
  return '<span class="bar" style="width:' + (120 * p).toFixed(1) + 'px;background:rgb(' + D.colours[k] + ')"></span>';
}
function explain(i) {
  const L = D.layers[shown], pi = L.pi[i];
  document.body.dataset.token = i;
  let html = "<b>" + D.visible[i] + "</b> (token " + (i + 1) + ") in layer " + L.layer + ": Pi = ";
  html += pi.map((p, k) => "head " + (k + 1) + " " + bar(p, k) + " " + p.toFixed(3)).join(" &nbsp; ");
  html += '<br><span class="muted">its largest Pi in each layer shown: ' +
    D.layers.map(M => "layer " + M.layer + ": head " + (M.dominant[i] + 1) + " (" + M.pi[i][M.dominant[i]].toFixed(2) +
      ")").join(", ") +
    "</span>";
  document.getElementById("info").innerHTML = html;
}
tokens.forEach((t, i) => { t.addEventListener("mouseenter", () => explain(i));
                           t.addEventListener("focus", () => explain(i)); });
document.querySelectorAll("#layers input").forEach(r => r.addEventListener("change", () => {
  show(D.layers.findIndex(L => String(L.layer) === r.value)); }));
const asked = /layer=(\\d+)/.exec(location.hash);
const start = asked ? D.layers.findIndex(L => String(L.layer) === asked[1]) : 0;
show(start >= 0 ? start : 0);
explain(0);  // the first token's Pi until the reader points at another
document.body.dataset.ready = "yes";
"""


def text_html(pieces, backgrounds, dominant):
    """The text as one focusable span per token (a newline drawn, then broken)."""
    spans = []
    for i, (piece, bg, k) in enumerate(zip(pieces, backgrounds, dominant)):
        shown = html.escape(piece.replace("\n", "\u21b5\n").replace("\t", "\u21e5\t"))
        spans.append(f'<span class="tok" tabindex="0" data-i="{i}" data-head="{k + 1}" '
                     f'style="background-color:{bg}">{shown}</span>')
    return "".join(spans)


def layer_section(shown, val, t, colours):
    """One layer's part of the page: shown, the layer's entry of the report; val, the numbers of the
    val windows, t its index among the TSSA layers: the entropy of Pi, R_var, what each head takes
    (val windows) and s along the text."""
    cells = "".join(f"<th>{c}</th>" for c in CLASSES)
    H, n, by_position = len(colours), len(val["starts"]), val["entropy_by_position"][t]
    rows = []
    for row, s in zip(val["heads"][t], shown["s_mean"]):
        k = row["head"] - 1
        top = ", ".join(f'<span class="nowrap"><span class="piece">{html.escape(visible(p))}</span> {100 * f:.0f}% '
                        f'({100 * f_all:.0f}%)</span>' for p, f, f_all in row["top"])
        means = "".join(f'<td class="num">{"" if v is None else f"{v:.2f}"}</td>' for v in row["mean_pi"].values())
        swatch = f'<span class="swatch" style="background:rgb{colours[k]}"></span>'
        rows.append(f'<tr><td class="nowrap">{swatch}head {k + 1}</td>'
                    f'<td class="num">{100 * row["share"]:.0f}%</td><td>{top}</td>{means}'
                    f"<td>{sparkline(s, colours[k])}</td></tr>")
    return (f'<section class="layer" data-layer="{shown["layer"]}"><h2>Layer {shown["layer"]}</h2>'
            f"<p>Mean entropy of Pi: {shown['entropy']:.3f} on this text, {val['entropy'][t]:.3f} over {n} val "
            f"windows (log H = {math.log(H):.3f}: no grouping; 0: each token in one head). By position, over the "
            f"windows: {sparkline(by_position, (128, 128, 128))}</p><p>R_var over the val windows: "
            f"{val['before'][t]:.4g} before this layer's step, {val['after'][t]:.4g} after (lowered in "
            f"{100 * val['lowered'][t]:.0f}% of the windows).</p>"
            f'<table><tr><th rowspan="2">head</th><th rowspan="2">share of tokens (largest Pi)</th>'
            f'<th rowspan="2">its most frequent tokens: share of its tokens (of all tokens)</th>'
            f'<th colspan="{len(CLASSES)}">mean Pi on</th><th rowspan="2">running statistic s along the text '
            f"(mean over features)</th></tr><tr>{cells}</tr>{''.join(rows)}</table></section>")


def rvar_table(rvar, tssa_layers):
    """R_var before and after each TSSA layer's step, mean over the windows of each split."""
    head = "".join(f"<th>{s}: before</th><th>after</th><th>windows lowered</th>" for s in ("train", "val"))
    rows = "".join(f"<tr><td>{layer}</td>" + "".join(
        f'<td class="num">{rvar[s]["before"][t]:.4g}</td><td class="num">{rvar[s]["after"][t]:.4g}</td>'
        f'<td class="num">{100 * rvar[s]["lowered"][t]:.0f}%</td>' for s in ("train", "val")) + "</tr>"
        for t, layer in enumerate(tssa_layers))
    n = len(rvar["val"]["starts"])
    return (f"<h2>R_var before and after each layer's step</h2><p class='muted'>Mean over {n} train and {n} val "
            f"windows; the same U and Pi before and after (lm_inspect.py's docstring, MATH.md §7).</p>"
            f"<table><tr><th>TSSA layer</th>{head}</tr>{rows}</table>")


def page(report, pieces, colours):
    """The whole index.html as text."""
    H, shown = report["n_head"], report["layers"]
    data = {"visible": [html.escape(visible(p)) for p in pieces], "colours": [",".join(map(str, c)) for c in colours],
            "layers": [{k: L[k] for k in ("layer", "pi", "dominant", "background")} for L in shown]}
    switch = "".join(f'<label><input type="radio" name="layer" id="layer-{L["layer"]}" value="{L["layer"]}"'
                     f'{" checked" if i == 0 else ""}> layer {L["layer"]}</label>' for i, L in enumerate(shown))
    legend = "".join(f'<span><span class="swatch" style="background:rgb{c}"></span>head {k + 1}</span>'
                     for k, c in enumerate(colours))
    val = report["rvar"]["val"]
    sections = [layer_section(L, val, report["tssa_layers"].index(L["layer"]), colours) for L in shown]
    skipped = (f"<p class='muted'>Softmax blocks (no Pi), skipped: {', '.join(map(str, report['skipped']))}.</p>"
               if report["skipped"] else "")
    first = shown[0]
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Inside {html.escape(report['checkpoint_name'])}: Pi over a text</title><style>{PAGE_STYLE}</style></head>
<body data-layer="{first['layer']}">
<h1>Which tokens each head takes: {html.escape(report['checkpoint_name'])}</h1>
<p class="muted">{html.escape(report['description'])}. Pi (MATH.md §7) is how much each token belongs to each
head's group; a token is coloured by the head with its largest Pi, stronger the surer (pale: near 1/{H}).
Hover over a token, or move to it with Tab, to see its whole Pi.</p>
{skipped}
<fieldset id="layers"><legend>Layer</legend>{switch}</fieldset>
<div id="legend" aria-label="legend">{legend}</div>
<div id="text">{text_html(pieces, first['background'], first['dominant'])}</div>
<div id="info" aria-live="polite"></div>
<noscript><p>Without JavaScript the page shows layer {first['layer']} only, without the Pi of each token.</p></noscript>
{''.join(sections)}
{rvar_table(report['rvar'], report['tssa_layers'])}
<script type="application/json" id="data">{blob}</script>
<script>{PAGE_SCRIPT}</script>
</body></html>
"""


# -----------------------------------------------------------------------------
# a picture of the page, by a headless browser


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser():
    """The path of a Chromium-like browser on PATH, or None."""
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def screenshot_png(page_path, *, size=(1100, 1000), layer=None, dark=False, dom=False):
    """PNG bytes of the page at page_path as headless Chromium draws it in a window of size
    (width, height): at its first layer (or `layer`), in a light (or dark) browser theme; with
    dom=True, (PNG bytes, the page's HTML after its script ran). Host names resolve to nothing,
    so the page gets no network even if it asked for it."""
    url = "file://" + os.path.abspath(page_path) + (f"#layer={layer}" if layer else "")
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "page.png")
        command = [browser(), "--headless", "--no-sandbox",  # (no sandbox: root in a container has none to give)
                   "--disable-gpu", "--hide-scrollbars", "--force-color-profile=srgb", "--no-first-run",
                   "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                   "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp}/profile",
                   f"--window-size={size[0]},{size[1]}", f"--screenshot={png}"]
        command += ["--force-dark-mode"] * dark + ["--dump-dom"] * dom + [url]
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not os.path.isfile(png):
            last = (done.stderr.strip().splitlines() or ["no message"])[-1][-160:]
            raise cli.UserError(f"{command[0]} could not draw {page_path} (exit {done.returncode}: {last}): "
                                "leave --screenshot out, or check the browser runs headless")
        with open(png, "rb") as f:
            return (f.read(), done.stdout) if dom else f.read()


# -----------------------------------------------------------------------------


def shown_tokens(cfg, encode, T, folder, meta):
    """The token ids of the text to show (at most T) and where they came from."""
    if cfg.text:
        ids = encode(loading.prompt_text(cfg.text))  # the text given, or the file that FILE:path names
        cli.require(ids, "the text is empty: give at least one character/token with --text")
        note = f"the first {T} tokens of the text given" if len(ids) > T else "the text given"
        return ids[:T], note
    n_val = meta["splits"]["val"]
    cli.require(cfg.val_start + T < n_val, f"val_start={cfg.val_start} leaves less than a window of {T} tokens in "
                                         f"val.bin ({n_val:,} tokens): give --val_start below {n_val - T}")
    x, _ = td.read_batch(folder, "val", [cfg.val_start], T, "cpu", meta)
    return x[0].tolist(), f"val.bin tokens {cfg.val_start}..{cfg.val_start + T - 1}"


def text_layers(model, idx, chosen, colours):
    """For each chosen layer, over the text idx (1, T): Pi (T, H, 4 decimals), the dominant head
    and the page's colour of each token, the mean entropy of Pi, s along the text (H, T)."""
    layer_maps = recorded_forward(model, idx)[1]
    unused = forks.statistic_unused(model, layer_maps)
    if unused:  # a fork whose s is not model.py's: said, and the page drawn
        print(f"{cli.script_name(sys.argv[0])}: warning: {unused}", file=sys.stderr)
    shown = []
    for layer in chosen:
        m = layer_maps[layer - 1]
        pi = m["pi"][0].cpu().double()  # (H, T)
        shown.append({"layer": layer, "pi": [[round(v, 4) for v in col] for col in pi.T.tolist()],
                      "dominant": pi.argmax(0).tolist(), "background": token_backgrounds(pi, colours),
                      "entropy": float(entropy(pi).mean()),
                      "s_mean": forks.running_statistic(m["w"], m["pi"])[0].mean(-1).tolist()})  # (H, T)
    return shown


def load(cfg, dev, given):
    """(model, ckpt, path) of a TSSA run (or of a model export.py wrote), or one line that says why not."""
    model, ckpt, path = loading.load_reader_model(cfg, dev, given)
    if not any(isinstance(block.attn, TSSA) for block in model.blocks):  # (a fork's subclass too)
        raise cli.UserError(f"{path} is a {model.config.attn} model: lm_inspect.py draws TSSA's Pi and statistics; "
                            "give a ToST run (attn=tssa, e.g. --out_dir=out-pydocs-char-tost)")
    return model, ckpt, path


def main(argv):
    cfg, given = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    cfg.device = devices.choose_device_dtype(cfg.device, "float32")[0]
    model, ckpt, path = load(cfg, cfg.device, given)
    tssa_layers = [i + 1 for i, b in enumerate(model.blocks) if isinstance(b.attn, TSSA)]
    chosen = layer_numbers(cfg.layers, "1,6") or tssa_layers  # the page opens at the first
    outside = sorted(set(chosen) - set(tssa_layers))
    cli.require(not outside, f"layers {lists.few(map(str, outside))}: this model's TSSA layers are "
                             f"{','.join(map(str, tssa_layers))}: choose among them")
    out = cfg.page_dir or (hub.beside(cfg.init_from, "inspect") if cfg.init_from else
                         os.path.join(os.path.dirname(os.path.abspath(path)), "inspect"))
    if cfg.init_from:
        hub.check_outside(out, cfg.init_from, "--page_dir", "inspect")
    out_set = claim_outputs(out, "--page_dir=<another folder>", "lm_inspect.py")  # before any work
    if cfg.screenshot:
        outputs.claim_output(cfg.screenshot, "--screenshot=<another file>")
    run = ckpt["config"]
    dataset, T, H = run.get("dataset") or ckpt["tokenizer"].get("dataset"), model.config.block_size, model.config.n_head
    cli.require(dataset, f"{path} does not say what it was trained on: inspect a run of train.py (--out_dir=<run>)")
    folder, meta = td.open_dataset(cfg.data_dir or run.get("data_dir", "data"), dataset, ("train", "val"), T)
    td.check_tokenizer(ckpt, meta, path, dataset, "inspect it with the data it was trained on (--data_dir)")
    encode, decode = td.load_tokenizer(ckpt["tokenizer"])

    # the text: each chosen layer's Pi, its dominant head and the running statistic along it
    ids, description = shown_tokens(cfg, encode, T, folder, meta)
    pieces = [decode([t]) for t in ids]
    colours = head_colours(H)
    report = {"checkpoint": os.path.abspath(path), "checkpoint_name": path, "iter": ckpt.get("iter_num"),
              "attn": model.config.attn, "short_conv": model.config.short_conv, "n_head": H,
              "tssa_layers": tssa_layers, "skipped": sorted(set(range(1, len(model.blocks) + 1)) - set(tssa_layers)),
              "description": f"{path} (iteration {ckpt.get('iter_num')}): {description}",
              "tokens": ids, "pieces": pieces, "colours": colours,
              "layers": text_layers(model, torch.tensor([ids], device=cfg.device), chosen, colours)}

    # R_var over windows of both splits, what each head takes over the val windows
    report["rvar"] = {}
    for split in ("train", "val"):
        n = meta["splits"][split]
        starts = torch.randint(0, n - T, (cfg.n_windows,), generator=torch.Generator().manual_seed(0)).tolist()
        report["rvar"][split] = over_windows(model, folder, split, starts, T, cfg, meta, decode)

    title = f"{path}: iteration {ckpt.get('iter_num')}, {len(tssa_layers)} TSSA layers of {len(model.blocks)}"
    files = {"pi_tokens.png": pi_tokens_figure(pieces, [torch.tensor(L["pi"]).T.numpy() for L in report["layers"]],
                                               chosen, f"Pi over {description}; {title}"),
             "rvar.png": rvar_figure(report["rvar"], tssa_layers, f"{cfg.n_windows} windows of {T} tokens", title),
             "index.html": page(report, pieces, colours).encode()}
    report["files"] = sorted(files) + ["inspect.json"]
    print_summary(report, H)
    write_all(out_set, files, report, cfg.screenshot)
    return report


def write_all(out_set, files, report, screenshot):
    """The page's files as one unit (an earlier page is replaced whole); then its picture, if asked."""
    out = out_set.path
    replacing = " (replacing the earlier inspection)" if write_outputs(out_set, files, report) else ""
    print(f"wrote {', '.join(report['files'])} to {out}{replacing}")
    if screenshot:  # after the page is whole: the picture shows the file as written
        replacing = " (replacing it)" if os.path.exists(screenshot) else ""
        png = screenshot_png(os.path.join(out, "index.html"))
        with atomic.atomic_write(screenshot) as f:
            f.write(png)
        print(f"wrote {screenshot}{replacing}: the page as it opens")


def print_summary(report, H):
    """Per TSSA layer: entropy of Pi against log H, R_var before and after, what each head takes."""
    val = report["rvar"]["val"]
    print(f"{report['description']}; over {len(val['starts'])} val windows (log H = {math.log(H):.3f}):")
    for t, layer in enumerate(report["tssa_layers"]):
        by_position = val["entropy_by_position"][t]
        early, late = by_position[:8], by_position[len(by_position) // 2:]
        print(f"layer {layer}: entropy of Pi {val['entropy'][t]:.3f} (first 8 tokens {sum(early) / len(early):.3f}, "
              f"last half {sum(late) / len(late):.3f}), R_var {val['before'][t]:.4g} -> "
              f"{val['after'][t]:.4g} (lowered in {100 * val['lowered'][t]:.0f}% of the windows)")
        for row in val["heads"][t]:
            top = ", ".join(f"{visible(p)} {100 * f:.0f}% ({100 * f_all:.0f}%)" for p, f, f_all in row["top"])
            means = ", ".join(f"{c} {v:.2f}" for c, v in row["mean_pi"].items() if v is not None)
            print(f"  head {row['head']}: {100 * row['share']:3.0f}% of tokens, most often {top}; mean Pi on {means}")
    if report["skipped"]:
        print(f"softmax blocks (no Pi), skipped: {', '.join(map(str, report['skipped']))}")


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
