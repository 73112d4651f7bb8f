"""
Seeing inside a trained ToST-ViT (the paper's white-box pictures, MATH.md §7), with matplotlib:

    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt                  # images from its val split
    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt --images=my_pictures/ --layers=1,4

Writes into out_dir (default <checkpoint folder>/inspect):
  pi_XX.png        image XX, then Pi of each head on the patch grid, one row per chosen layer
                   (colour scale 0..1; 1/H everywhere would mean no grouping)
  cls_attn_XX.png  image XX, then the class token's attention over the patches, per head, in
                   the first class-attention layer
  rvar.png         R_var layer by layer (paper Figure 4a), mean over n_rvar train and n_rvar val
                   images, after and before each layer's TSSA step; and after - before per layer
  inspect.json     every number plotted, per-image values of the shown images, the indices used

What R_var is measured on. For ToST block l, forward(images, return_maps=True) gives z = ln_1(x)
(the tokens TSSA receives), w = c_in(z) (U^T z + b, per head), Pi (from w) and out =
c_proj(TSSA(w)). before_l = compression_objective(w, Pi); after_l = compression_objective(
c_in(z + g * out), Pi) with g the layer scale: the tokens before and after this layer's step,
seen through the same U and Pi. Images get the evaluation crop (no augmentation). A step lowers
R_var for certain only with the tied output map of the theory (MATH.md §2.5); the learned c_proj is
free, and the tool reports what it finds.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FormatStrFormatter, MaxNLocator

import trainkit
import vit_train
from model import _split_heads, compression_objective

# -----------------------------------------------------------------------------
# settings
ckpt = ""  # the checkpoint to inspect (a ckpt.pt written by vit_train.py)
images = ""  # a folder of image files to show; "" = the first n_show images of the val split
n_show = 4
layers = ""  # 1-based ToST layers to draw Pi for, e.g. "1,6,12"; "" = first, middle and last
n_rvar = 500  # train and val images each for the R_var figure (the paper: 500 + 500)
batch_size = 50
out_dir = ""  # "" = <checkpoint folder>/inspect
device = "cpu"
num_threads = 0
DEFAULTS = trainkit.config_defaults(globals())
# -----------------------------------------------------------------------------


@torch.no_grad()
def rvar_before_after(model, x):
    """x (B, 3, S, S) normalised -> R_var before and after each layer's step, each (B, L),
    and the forward's maps (with "logits")."""
    logits, maps = model(x, return_maps=True)
    maps["logits"] = logits
    before, after = [], []
    for block, m in zip(model.blocks, maps["layers"]):
        before.append(compression_objective(m["w"], m["pi"]))  # (B,)
        w_after = _split_heads(block.attn.c_in(m["z"] + block.ls_1(m["out"])), block.attn.n_head)  # same U
        after.append(compression_objective(w_after, m["pi"]))  # same Pi
    return torch.stack(before, 1), torch.stack(after, 1), maps


def rvar_over(model, view, indices, dataset_name, bs, dev):
    """Mean (and share lowered) of R_var before/after per layer over view[indices]."""
    before, after = [], []
    for i in range(0, len(indices), bs):
        x = torch.stack([view[j][0] for j in indices[i:i + bs]])
        b, a, _ = rvar_before_after(model, vit_train.to_input(x, dataset_name, dev))
        before.append(b.cpu()), after.append(a.cpu())
    before, after = torch.cat(before).double(), torch.cat(after).double()  # (n, L)
    return {"indices": indices, "before": before.mean(0).tolist(), "after": after.mean(0).tolist(),
            "lowered": (after < before).double().mean(0).tolist()}  # share of images the step lowered


def parse_layers(text, n_layer):
    if not text:
        return sorted({1, (n_layer + 1) // 2, n_layer})
    try:
        chosen = [int(t) for t in str(text).replace(" ", "").split(",") if t]
    except ValueError:
        raise trainkit.ConfigError(f"layers must be layer numbers like '1,6,12', got {text!r}") from None
    if any(not 1 <= l <= n_layer for l in chosen):
        raise trainkit.ConfigError(f"layers {chosen} out of range: this model has layers 1..{n_layer}")
    return chosen


# -----------------------------------------------------------------------------
# figures


def map_figure(path, picture, rows, row_labels, title, scale_label, vmax):
    """The input image, then one heat map per head, one row per entry of rows ((H, h, w) each),
    one shared colour scale 0..vmax with its bar."""
    H = rows[0].shape[0]
    fig, axes = plt.subplots(len(rows), H + 1, figsize=(1.9 * (H + 1) + 0.8, 1.9 * len(rows) + 0.6),
                             squeeze=False, layout="constrained")
    for r, (maps, label) in enumerate(zip(rows, row_labels)):
        axes[r, 0].imshow(picture)
        axes[r, 0].set_ylabel(label)
        for h in range(H):
            im = axes[r, h + 1].imshow(maps[h], cmap="viridis", vmin=0, vmax=vmax)
        for ax in axes[r]:
            ax.set_xticks([]), ax.set_yticks([])
    for c, name in enumerate(["input"] + [f"head {h + 1}" for h in range(H)]):
        axes[0, c].set_title(name, fontsize=10)
    bar = fig.colorbar(im, ax=axes, shrink=0.9)
    bar.set_label(scale_label)
    bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rvar_figure(path, rvar, title):
    """Figure 4a: R_var after (solid) and before (dotted) each layer's step; after - before."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    L = len(rvar["val"]["after"])
    layers = list(range(1, L + 1))
    for split, colour in (("train", "tab:blue"), ("val", "tab:orange")):
        r = rvar[split]
        left.plot(layers, r["after"], "-o", color=colour, label=f"{split}, after the step")
        left.plot(layers, r["before"], ":", color=colour, label=f"{split}, before the step")
        offset = -0.2 if split == "train" else 0.2
        right.bar([l + offset for l in layers], [a - b for a, b in zip(r["after"], r["before"])], width=0.4,
                  color=colour, label=split)
    right.axhline(0, color="black", linewidth=0.8)
    left.set(title="R_var by layer", xlabel="ToST layer", ylabel=f"R_var (mean of {len(rvar['val']['indices'])} images)")
    right.set(title="after - before (below 0: the step lowered R_var)", xlabel="ToST layer", ylabel="change in R_var")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------


def shown_images(cfg, tcfg, S):
    """(uint8 images (B, 3, S, S), names, true labels or None) to draw."""
    if cfg["images"]:
        folder = cfg["images"]
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"images={folder!r} is not a folder")
        paths = [os.path.join(folder, f) for f in sorted(os.listdir(folder))
                 if f.lower().endswith(vit_train.IMAGE_EXTENSIONS)][:cfg["n_show"]]
        if not paths:
            raise FileNotFoundError(f"no image files in {folder!r}")
        pics = [vit_train.center_crop(vit_train.load_image(p), S, tcfg["eval_crop_pct"]) for p in paths]
        return torch.stack(pics), paths, [None] * len(paths)
    val = vit_train.build_sources(tcfg)[1]
    view = vit_train.View(val, tcfg, train=False)
    idx = range(min(cfg["n_show"], len(val)))
    return torch.stack([view[i][0] for i in idx]), [f"val[{i}]" for i in idx], [val.labels[i] for i in idx]


def main(argv=None):
    cfg = trainkit.configure(DEFAULTS, sys.argv[1:] if argv is None else argv)
    if cfg["num_threads"] > 0:
        torch.set_num_threads(cfg["num_threads"])
    if not cfg["ckpt"]:
        raise trainkit.ConfigError("give the checkpoint to inspect: --ckpt=out-vit-cpu/ckpt.pt")
    dev = cfg["device"]
    ck = trainkit.load_checkpoint(cfg["ckpt"])
    model = vit_train.model_from_checkpoint(ck).to(dev).eval()
    tcfg = {**vit_train.DEFAULTS, **ck["config"], "img_size": model.config.img_size}
    S, H, L, is_tost = model.config.img_size, model.config.n_head, model.config.n_layer, model.config.attn == "tssa"
    chosen = parse_layers(cfg["layers"], L)
    out = cfg["out_dir"] or os.path.join(os.path.dirname(os.path.abspath(cfg["ckpt"])), "inspect")
    os.makedirs(out, exist_ok=True)
    shown, sources, truth = shown_images(cfg, tcfg, S)
    x = vit_train.to_input(shown, tcfg["dataset"], dev)
    if is_tost:
        before, after, maps = rvar_before_after(model, x)
    else:  # a softmax baseline has no Pi and no R_var: class attention only
        with torch.no_grad():
            logits, maps = model(x, return_maps=True)
        maps["logits"] = logits
    Hp, Wp = maps["grid"]
    classes = ck.get("classes") or [str(k) for k in range(model.config.num_classes)]
    probs = maps["logits"].float().softmax(-1).cpu()
    report = {"checkpoint": os.path.abspath(cfg["ckpt"]), "iter": ck.get("iter_num"), "attn": model.config.attn,
              "grid": [Hp, Wp], "layers_shown": chosen, "images": [], "files": []}
    for i in range(len(shown)):
        entry = {"source": sources[i], "predicted": classes[int(probs[i].argmax())], "p": float(probs[i].max()),
                 "true": None if truth[i] is None else classes[truth[i]]}
        title = (f"true: {entry['true']}, " if entry["true"] else "") + f"predicted: {entry['predicted']}"
        picture = shown[i].permute(1, 2, 0).numpy()
        if is_tost:
            rows = [maps["layers"][l - 1]["pi"][i].view(H, Hp, Wp).cpu().numpy() for l in chosen]
            map_figure(os.path.join(out, f"pi_{i:02d}.png"), picture, rows, [f"layer {l}" for l in chosen],
                       f"Pi (membership of each patch in each head's group); {title}", "Pi", 1.0)
            entry["rvar_before"], entry["rvar_after"] = before[i].tolist(), after[i].tolist()
            report["files"].append(f"pi_{i:02d}.png")
        attn = maps["cls_attn"][0][i].view(H, Hp, Wp).cpu().numpy()
        map_figure(os.path.join(out, f"cls_attn_{i:02d}.png"), picture, [attn], ["class attention, layer 1"],
                   f"class-token attention over the patches; {title}", "attention weight", float(attn.max()))
        report["files"].append(f"cls_attn_{i:02d}.png")
        report["images"].append(entry)
    if is_tost:  # Figure 4a on train and val images, a fixed subset of each
        report["rvar"] = {}
        for split, src in zip(("train", "val"), vit_train.build_sources(tcfg)):
            indices = torch.randperm(len(src), generator=torch.Generator().manual_seed(0))[:cfg["n_rvar"]].tolist()
            view = vit_train.View(src, tcfg, train=False)
            report["rvar"][split] = rvar_over(model, view, indices, tcfg["dataset"], cfg["batch_size"], dev)
        rvar_figure(os.path.join(out, "rvar.png"), report["rvar"], f"{cfg['ckpt']}: {L} ToST layers, "
                    f"iteration {ck.get('iter_num')}")
        report["files"].append("rvar.png")
        print("R_var after each layer's step (val):", " ".join(f"{v:.4g}" for v in report["rvar"]["val"]["after"]))
        print("share of val images the step lowered, by layer:",
              " ".join(f"{100 * v:.0f}%" for v in report["rvar"]["val"]["lowered"]))
    with open(os.path.join(out, "inspect.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {len(report['files'])} pictures and inspect.json to {out}")
    return report


if __name__ == "__main__":
    trainkit.run_cli(main)
