"""
Seeing inside a trained ToST-ViT (the paper's white-box pictures, notes §7), in one command:

    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt                  # images from its val split
    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt --images=my_pngs/ --layers=1,4,6

Writes PNG files a person can open, and the numbers behind them, into out_dir
(default: <checkpoint folder>/inspect):

  pi_XX.png        image XX, then Pi of each head on the patch grid, one row per chosen layer
                   (colour scale fixed: 0 dark purple .. 1 yellow; 1/H everywhere = no grouping);
                   footer: true class (val images), predicted class, the colour scale
  cls_attn_XX.png  image XX, then the attention of the class token over the patches, one panel
                   per head, of the first class-attention layer (each head scaled to its maximum)
  rvar.png         left: R_var layer by layer, mean over n_rvar train and n_rvar val images,
                   after (solid, Figure 4a) and before (dotted) each layer's TSSA step;
                   right: after - before per layer (below zero: the step lowered R_var)
  inspect.json     every number plotted, per-image values for the shown images, the indices
                   of the images used, the PNG sizes

What R_var is measured on. model.ToSTViT.forward(images, return_maps=True) gives, for each
ToST block l (model in eval mode, fp32):
  z_l   = ln_1(x_l), the layer-normed block input: exactly the tokens TSSA receives  (B, N, C)
  w_l   = c_in(z_l) = U_l^T z_l + b_l, the features in the heads' bases, as TSSA uses them
          (including the bias of c_in; ViT blocks have biases)                     (B, H, N, p)
  pi_l  = the memberships TSSA computed from w_l (softmax over heads)                (B, H, N)
  out_l = c_proj(TSSA(w_l)), the attention branch output                            (B, N, C)
and, with g_l the layer scale of that branch (ls_1) and compression_objective from model.py,
  before_l = compression_objective(w_l, pi_l)                    = R_var(Z_l | Pi_l, U_l)
  after_l  = compression_objective(c_in(z_l + g_l * out_l), pi_l) = R_var(Z_l + step | Pi_l, U_l)
i.e. the tokens before and after this layer's TSSA step, both seen through the same U_l and
Pi_l. Figure 4a plots after_l against l. Train and val images are both prepared as for
evaluation (centre crop, normalisation; no augmentation), n_rvar of each, a fixed subset. The within-layer check is after_l < before_l; it is
a theorem only for the tied operator (output map = step * U, notes §2); with the learned,
untied c_proj it is an empirical question, and the tool reports what it finds.

PNGs are written by pngio.py (zlib + struct, no imaging library); text uses a built-in 3x5 font.
"""

import json
import os
import sys

import numpy as np
import torch

import pngio
import trainkit
import vit_train
from model import _split_heads, compression_objective

# -----------------------------------------------------------------------------
# default settings (--key=value overrides them)
ckpt = ""  # the checkpoint to inspect (a ckpt.pt written by vit_train.py)
images = ""  # a folder of image files to show; "" = the first n_show images of the val split
n_show = 4  # images to draw
layers = ""  # 1-based ToST layers to draw Pi for, e.g. "1,6,12"; "" = first, middle and last
n_rvar = 500  # train and val images each for the R_var plot (the paper uses 500 + 500)
batch_size = 50
out_dir = ""  # "" = <checkpoint folder>/inspect
device = "cpu"
num_threads = 0  # CPU threads for torch (0: torch's default; 1 is best on a small or busy CPU)
DEFAULTS = trainkit.config_defaults(globals())
# -----------------------------------------------------------------------------

PAD = 4  # pixels between panels and around the picture
LABEL_H = 14  # height of a text strip (3x5 font at scale 2, plus margins)
TEXT_SCALE = 2
PANEL_TARGET = 128  # panels are img_size * max(1, PANEL_TARGET // img_size) pixels square
PLOT_W, PLOT_H = 900, 380  # size of rvar.png
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (170, 170, 170)
TRAIN_COLOUR, VAL_COLOUR = (31, 119, 180), (230, 110, 10)
# colour scale for heat maps, 0 -> 1 (the viridis anchors, linearly interpolated)
RAMP = np.array([(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)], np.float64)

# -----------------------------------------------------------------------------
# PNG writing


def write_png(path, pixels):
    with open(path, "wb") as f:
        f.write(pngio.encode_png(pixels))
    return [int(pixels.shape[1]), int(pixels.shape[0])]  # width, height


# -----------------------------------------------------------------------------
# drawing into numpy canvases (H, W, 3) uint8

FONT = {  # 3x5 glyphs, rows top to bottom
    "0": "111101101101111", "1": "010110010010111", "2": "110001010100111", "3": "110001010001110",
    "4": "101101111001001", "5": "111100110001110", "6": "011100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001110", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    ".": "000000000000010", "-": "000000111000000", "_": "000000000000111", ":": "000010000010000",
    "=": "000111000111000", "(": "001010010010001", ")": "100010010010100", "/": "001001010100100",
    "+": "000010111010000", "%": "101001010100101", ",": "000000000010100", " ": "000000000000000",
    "<": "001010100010001", ">": "100010001010100",
}


def draw_text(canvas, y, x, text, colour=BLACK, scale=TEXT_SCALE):
    """Write text (upper-cased) with its top-left corner at (y, x); clipped at the edges."""
    H, W = canvas.shape[:2]
    for ch in str(text).upper():
        glyph = np.array([int(b) for b in FONT.get(ch, FONT[" "])], bool).reshape(5, 3)
        glyph = glyph.repeat(scale, 0).repeat(scale, 1)
        gy, gx = np.nonzero(glyph)
        gy, gx = gy + y, gx + x
        keep = (gy >= 0) & (gy < H) & (gx >= 0) & (gx < W)
        canvas[gy[keep], gx[keep]] = colour
        x += 4 * scale
    return x


def text_width(text, scale=TEXT_SCALE):
    return 4 * scale * len(str(text))


def draw_line(canvas, p0, p1, colour, width=2, dash=0):
    """A straight line between (y, x) points; dash > 0 draws dash pixels on, dash off."""
    (y0, x0), (y1, x1) = p0, p1
    n = int(max(abs(y1 - y0), abs(x1 - x0)) * 2) + 1
    t = np.linspace(0, 1, n)
    ys, xs = y0 + (y1 - y0) * t, x0 + (x1 - x0) * t
    if dash:
        travelled = t * np.hypot(y1 - y0, x1 - x0)
        keep = (travelled // dash) % 2 == 0
        ys, xs = ys[keep], xs[keep]
    H, W = canvas.shape[:2]
    for dy in range(width):
        for dx in range(width):
            yy = np.clip(np.round(ys).astype(int) + dy - width // 2, 0, H - 1)
            xx = np.clip(np.round(xs).astype(int) + dx - width // 2, 0, W - 1)
            canvas[yy, xx] = colour


def fill_rect(canvas, y0, x0, y1, x1, colour):
    y0, y1 = sorted((int(round(y0)), int(round(y1))))
    x0, x1 = sorted((int(round(x0)), int(round(x1))))
    canvas[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = colour


def colourise(values, lo=0.0, hi=1.0):
    """(h, w) floats -> (h, w, 3) uint8 through RAMP, lo -> first colour, hi -> last."""
    t = np.clip((np.asarray(values, np.float64) - lo) / max(hi - lo, 1e-12), 0, 1) * (len(RAMP) - 1)
    i = np.minimum(t.astype(int), len(RAMP) - 2)
    frac = (t - i)[..., None]
    return np.round(RAMP[i] * (1 - frac) + RAMP[i + 1] * frac).astype(np.uint8)


def upscale(pixels, size):
    """Nearest-neighbour resize of (h, w[, 3]) to (size, size[, 3])."""
    rows = np.arange(size) * pixels.shape[0] // size
    cols = np.arange(size) * pixels.shape[1] // size
    return pixels[rows][:, cols]


def panel_grid(rows, row_labels, col_labels, cell, footer="", legend=("0", "1")):
    """Panels (cell, cell, 3) in a grid: a header strip with the column labels, then per row a
    label strip and the panels, then a footer strip: `footer` text followed by the colour
    scale (legend[0], the ramp, legend[1]). Size: width PAD + ncols * (cell + PAD),
    height PAD + LABEL_H + nrows * (LABEL_H + cell + PAD) + LABEL_H."""
    ncols = max(len(r) for r in rows)
    W = PAD + ncols * (cell + PAD)
    H = PAD + LABEL_H + len(rows) * (LABEL_H + cell + PAD) + LABEL_H
    canvas = np.full((H, W, 3), 255, np.uint8)
    for c, label in enumerate(col_labels):
        draw_text(canvas, PAD + 2, PAD + c * (cell + PAD), label)
    for r, (panels, label) in enumerate(zip(rows, row_labels)):
        top = PAD + LABEL_H + r * (LABEL_H + cell + PAD)
        draw_text(canvas, top + 2, PAD, label, GREY)
        for c, panel in enumerate(panels):
            left = PAD + c * (cell + PAD)
            canvas[top + LABEL_H:top + LABEL_H + cell, left:left + cell] = panel
    y = H - LABEL_H
    x = draw_text(canvas, y + 1, PAD, f"{footer}   colour: {legend[0]} " if footer else f"colour: {legend[0]} ")
    ramp_w = 64
    canvas[y + 1:y + 11, x:x + ramp_w] = colourise(np.linspace(0, 1, ramp_w)[None].repeat(10, 0))
    draw_text(canvas, y + 1, x + ramp_w + 4, legend[1])
    return canvas


def _ticks(lo, hi, n=5):
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _fmt(v):
    return f"{v:.3g}"


def plot_panel(canvas, box, title, x_labels, series, bars=False):
    """A line (or grouped bar) chart inside box = (top, left, height, width) of canvas.
    series: list of (label, values, colour, dash); values one per x position."""
    top, left, height, width = box
    values = np.concatenate([np.asarray(s[1], float) for s in series])
    lo, hi = float(values.min()), float(values.max())
    if bars:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    margin = 0.08 * (hi - lo)
    lo, hi = lo - margin, hi + margin
    ax_l, ax_r = left + 64, left + width - 8  # plot area
    ax_t, ax_b = top + 22 + LABEL_H * len(series), top + height - 24
    draw_text(canvas, top + 2, left + 64, title)
    for i, (label, _, colour, dash) in enumerate(series):  # legend
        y = top + 22 + LABEL_H * i
        draw_line(canvas, (y + 5, ax_l), (y + 5, ax_l + 24), colour, 2, dash)
        draw_text(canvas, y, ax_l + 32, label)
    to_y = lambda v: ax_b - (v - lo) / (hi - lo) * (ax_b - ax_t)
    for v in _ticks(lo + margin, hi - margin):  # y axis ticks and grid
        y = to_y(v)
        draw_line(canvas, (y, ax_l), (y, ax_r), (225, 225, 225), 1)
        draw_text(canvas, int(y) - 5, left + 2, _fmt(v), GREY)
    draw_line(canvas, (ax_t, ax_l), (ax_b, ax_l), BLACK, 1)
    draw_line(canvas, (ax_b, ax_l), (ax_b, ax_r), BLACK, 1)
    if bars:
        draw_line(canvas, (to_y(0), ax_l), (to_y(0), ax_r), BLACK, 1)
    n = len(x_labels)
    step = (ax_r - ax_l) / n
    xs = [ax_l + step * (i + 0.5) for i in range(n)]
    for x, label in zip(xs, x_labels):
        draw_text(canvas, ax_b + 6, int(x - text_width(label) / 2), label)
    for k, (_, vals, colour, dash) in enumerate(series):
        if bars:
            bw = 0.8 * step / len(series)
            for x, v in zip(xs, vals):
                x0 = x - 0.4 * step + k * bw
                fill_rect(canvas, to_y(0), x0, to_y(v), x0 + bw - 1, colour)
        else:
            pts = [(to_y(v), x) for x, v in zip(xs, vals)]
            for p, q in zip(pts, pts[1:]):
                draw_line(canvas, p, q, colour, 2, dash)
            for y, x in pts:
                fill_rect(canvas, y - 3, x - 3, y + 3, x + 3, colour)


# -----------------------------------------------------------------------------
# measurements


@torch.no_grad()
def rvar_before_after(model, x):
    """R_var before and after each ToST layer's TSSA step (see the docstring at the top):
    x (B, 3, S, S) normalised images -> (before, after) each (B, L), and the forward's maps."""
    logits, maps = model(x, return_maps=True)
    maps["logits"] = logits  # (B, classes)
    before, after = [], []
    for block, m in zip(model.blocks, maps["layers"]):
        before.append(compression_objective(m["w"], m["pi"]))  # (B,)
        stepped = m["z"] + block.ls_1(m["out"])  # (B, N, C): the tokens after the step
        w_after = _split_heads(block.attn.c_in(stepped), block.attn.n_head)  # same U
        after.append(compression_objective(w_after, m["pi"]))  # same Pi
    return torch.stack(before, 1), torch.stack(after, 1), maps


def subset_indices(n_total, n):
    """A fixed random subset of n of n_total image indices (the same on every run)."""
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(0))[:n].tolist()


def batch_of(view, indices):
    """Normalised-later uint8 images (B, 3, S, S) of the given indices of a CropView."""
    return torch.stack([view[i][0] for i in indices])


def rvar_over(model, view, indices, dataset_name, bs, dev):
    before, after = [], []
    for i in range(0, len(indices), bs):
        x = vit_train.normalise(batch_of(view, indices[i:i + bs]).to(dev).float() / 255, dataset_name)
        b, a, _ = rvar_before_after(model, x)
        before.append(b.cpu())
        after.append(a.cpu())
    before, after = torch.cat(before).double(), torch.cat(after).double()  # (n, L)
    return {"n_images": len(indices), "indices": indices,
            "before": before.mean(0).tolist(), "after": after.mean(0).tolist(),
            "before_std": before.std(0).tolist() if len(indices) > 1 else [0.0] * before.shape[1],
            "after_std": after.std(0).tolist() if len(indices) > 1 else [0.0] * after.shape[1],
            "lowered": (after < before).double().mean(0).tolist()}  # share of images the step lowered


# -----------------------------------------------------------------------------


def parse_layers(text, n_layer):
    if not text:
        return sorted({1, (n_layer + 1) // 2, n_layer})
    try:
        chosen = [int(t) for t in str(text).replace(" ", "").split(",") if t]
    except ValueError:
        raise trainkit.ConfigError(f"layers must be comma-separated layer numbers like '1,6,12', got {text!r}") from None
    bad = [l for l in chosen if not 1 <= l <= n_layer]
    if bad:
        raise trainkit.ConfigError(f"layers {bad} out of range: this model has layers 1..{n_layer}")
    return chosen


def main(argv=None):
    cfg = trainkit.configure(DEFAULTS, sys.argv[1:] if argv is None else argv)
    if cfg["num_threads"] > 0:
        torch.set_num_threads(cfg["num_threads"])
    if not cfg["ckpt"]:
        raise trainkit.ConfigError("give the checkpoint to inspect: --ckpt=out-vit-cpu/ckpt.pt")
    dev = cfg["device"]
    ck = trainkit.load_checkpoint(cfg["ckpt"])
    model = vit_train.model_from_checkpoint(ck).to(dev).eval()
    tcfg = {**vit_train.DEFAULTS, **ck["config"]}  # the settings it was trained with
    S, H, L = model.config.img_size, model.config.n_head, model.config.n_layer
    is_tost = model.config.attn == "tssa"
    chosen = parse_layers(cfg["layers"], L)
    out = cfg["out_dir"] or os.path.join(os.path.dirname(os.path.abspath(cfg["ckpt"])), "inspect")
    os.makedirs(out, exist_ok=True)
    name = tcfg["dataset"]

    # the images to draw: from a folder, else the first n_show of the val split
    train_src = val_src = None
    if cfg["images"]:
        paths, _, _ = (vit_train.scan_image_folder(cfg["images"]) if any(
            os.path.isdir(os.path.join(cfg["images"], e)) for e in os.listdir(cfg["images"])) else
            ([os.path.join(cfg["images"], f) for f in sorted(os.listdir(cfg["images"]))
              if f.lower().endswith(vit_train.IMAGE_EXTENSIONS)], None, None))
        if not paths:
            raise FileNotFoundError(f"no image files in {cfg['images']!r}")
        paths = paths[:cfg["n_show"]]
        shown = torch.stack([vit_train.center_crop(vit_train.load_image(p), S, tcfg["eval_crop_pct"]) for p in paths])
        sources, truth = paths, [None] * len(paths)  # the true class of a user's image is unknown
    else:
        train_src, val_src = vit_train.build_sources(tcfg)
        val_view = vit_train.CropView(val_src, S, train=False, crop_pct=tcfg["eval_crop_pct"])
        idx = list(range(min(cfg["n_show"], len(val_src))))
        shown, sources = batch_of(val_view, idx), [f"val[{i}]" for i in idx]
        truth = [val_src.get(i)[1] for i in idx]

    x = vit_train.normalise(shown.to(dev).float() / 255, name)
    if is_tost:
        before, after, maps = rvar_before_after(model, x)
    else:
        with torch.no_grad():
            logits, maps = model(x, return_maps=True)
        maps["logits"] = logits
    Hp, Wp = maps["grid"]
    classes = ck.get("classes") or [str(k) for k in range(model.config.num_classes)]
    probs = maps["logits"].float().softmax(-1).cpu()  # (B, classes)
    cell = S * max(1, PANEL_TARGET // S)
    report = {"checkpoint": os.path.abspath(cfg["ckpt"]), "iter": ck.get("iter_num"), "attn": model.config.attn,
              "img_size": S, "grid": [Hp, Wp], "n_layer": L, "n_head": H, "layers_shown": chosen,
              "measurement": __doc__.split("What R_var is measured on.")[1].split("PNGs are written")[0].strip(),
              "images": [], "pngs": {}}
    for i in range(len(shown)):
        picture = upscale(shown[i].permute(1, 2, 0).numpy(), cell)
        entry = {"source": sources[i], "predicted": classes[int(probs[i].argmax())], "p": float(probs[i].max()),
                 "true": None if truth[i] is None else classes[truth[i]]}
        caption = (f"true {entry['true']}, " if entry["true"] else "") + f"predicted {entry['predicted']}"
        if is_tost:
            rows = [[picture] + [upscale(colourise(maps["layers"][l - 1]["pi"][i, h].view(Hp, Wp).cpu().numpy()), cell)
                                 for h in range(H)] for l in chosen]
            grid = panel_grid(rows, [f"Pi, layer {l}" for l in chosen], ["input"] + [f"head {h + 1}" for h in range(H)],
                              cell, footer=caption, legend=("0", "1"))
            entry["pi_png"] = f"pi_{i:02d}.png"
            report["pngs"][entry["pi_png"]] = write_png(os.path.join(out, entry["pi_png"]), grid)
            entry["rvar_before"], entry["rvar_after"] = before[i].tolist(), after[i].tolist()
        attn = maps["cls_attn"][0][i].view(H, Hp, Wp).cpu().numpy()
        heads = [upscale(colourise(a, 0, max(float(a.max()), 1e-12)), cell) for a in attn]
        grid = panel_grid([[picture] + heads], ["class attention, layer 1"],
                          ["input"] + [f"head {h + 1}" for h in range(H)], cell, footer=caption,
                          legend=("0", "head max"))
        entry["cls_attn_png"] = f"cls_attn_{i:02d}.png"
        report["pngs"][entry["cls_attn_png"]] = write_png(os.path.join(out, entry["cls_attn_png"]), grid)
        report["images"].append(entry)

    if is_tost:  # Figure 4a: R_var layer by layer on train and val images
        if train_src is None:
            train_src, val_src = vit_train.build_sources(tcfg)
        report["rvar"] = {}
        for split, src in (("train", train_src), ("val", val_src)):
            view = vit_train.CropView(src, S, train=False, crop_pct=tcfg["eval_crop_pct"])
            indices = subset_indices(len(src), min(cfg["n_rvar"], len(src)))
            report["rvar"][split] = rvar_over(model, view, indices, name, cfg["batch_size"], dev)
        canvas = np.full((PLOT_H, PLOT_W, 3), 255, np.uint8)
        r = report["rvar"]
        xl = [str(l) for l in range(1, L + 1)]
        plot_panel(canvas, (0, 0, PLOT_H, PLOT_W // 2), "R_var by layer (x: layer)", xl, [
            ("train, after step", r["train"]["after"], TRAIN_COLOUR, 0),
            ("val, after step", r["val"]["after"], VAL_COLOUR, 0),
            ("train, before step", r["train"]["before"], TRAIN_COLOUR, 6),
            ("val, before step", r["val"]["before"], VAL_COLOUR, 6)])
        plot_panel(canvas, (0, PLOT_W // 2, PLOT_H, PLOT_W // 2), "after - before (<0: step lowers R_var)", xl, [
            ("train", [a - b for a, b in zip(r["train"]["after"], r["train"]["before"])], TRAIN_COLOUR, 0),
            ("val", [a - b for a, b in zip(r["val"]["after"], r["val"]["before"])], VAL_COLOUR, 0)], bars=True)
        report["pngs"]["rvar.png"] = write_png(os.path.join(out, "rvar.png"), canvas)
        lowered = [f"{100 * v:.0f}%" for v in r["val"]["lowered"]]
        print("R_var after each layer's TSSA step (val):", " ".join(f"{v:.4g}" for v in r["val"]["after"]))
        print("share of val images whose R_var the step lowered, by layer:", " ".join(lowered))
    else:
        print(f"a {model.config.attn} checkpoint has no Pi and no R_var: only class-attention maps are drawn")
    with open(os.path.join(out, "inspect.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {len(report['pngs'])} PNGs and inspect.json to {out}")
    return report


if __name__ == "__main__":
    trainkit.run_cli(main)
