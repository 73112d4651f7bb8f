"""
Seeing inside a trained ToST-ViT (the paper's white-box pictures, MATH.md §7), with matplotlib:

    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt                  # images from its val split
    python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt --images=my_pictures/ --layers=1,4
    python vit_inspect.py --init_from=<you>/vit-cpu                    # a model export.py wrote (folder, Hub id)

Writes out_dir (default <checkpoint folder>/inspect; with --init_from, <folder>-inspect beside the
model's folder, or <name>-inspect here for a Hub id) as one unit, swapped whole for an earlier set
(whose pictures this run does not draw go with it; a folder holding anything but an earlier set
is refused before any work; outputs.claim_set):
  pi_XX.png        image XX, then Pi of each head on the patch grid, one row per chosen layer
                   (colour scale 0..1; 1/H everywhere would mean no grouping)
  cls_attn_XX.png  image XX, then the class token's attention over the patches, per head, in
                   the first class-attention layer
  rvar.png         R_var layer by layer (paper Figure 4a), mean over n_rvar train and n_rvar val
                   images, after and before each layer's TSSA step; and after - before per layer
  inspect.json     every number plotted, per-image values of the shown images, the indices used

What R_var is measured on. For ToST block l, forward(images, record=maps) fills maps with z = ln_1(x)
(the tokens TSSA receives), w = w_proj(z) (U^T z + b, per head), Pi (from w) and out =
c_proj(TSSA(w)). before_l = compression_objective(w, Pi); after_l = compression_objective(
w_proj(z + g * out), Pi) with g the layer scale: the tokens before and after this layer's step,
seen through the same U and Pi. Images get the evaluation crop (no augmentation). A step lowers
R_var for certain only with the tied output map of the theory (MATH.md §2.5); the learned c_proj is
free, and the tool reports what it finds.
"""

import os
import sys
from types import SimpleNamespace

import torch
from tqdm import tqdm

from nanotost import cli, devices, hub, lists, loading, plots, vit_data
from nanotost.whitebox import claim_outputs, layer_numbers, png_bytes, rvar_figure, step_rvar, write_outputs

plt = plots.pyplot()  # (files only; a `$` in a path or a class name is a dollar sign)
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

# -----------------------------------------------------------------------------
# settings
ckpt = ""  # the checkpoint to inspect: a ckpt.pt written by vit_train.py, or the folder holding it
init_from = ""  # or a model export.py wrote: its folder, or its Hugging Face Hub id
images = ""  # a folder of image files to show; "" = the first n_show images of the val split
n_show = 4
layers = ""  # 1-based ToST layers to draw Pi for, e.g. "1,6,12"; "" = first, middle and last
n_rvar = 500  # train and val images each for the R_var figure (the paper: 500 + 500)
batch_size = 50
out_dir = ""  # "" = <checkpoint folder>/inspect
device = "cpu"  # "auto", "cpu", "cuda", "cuda:1"
num_threads = 0  # torch CPU threads (0: the training run's setting, else the machine's free cores)
# -----------------------------------------------------------------------------
DEFAULTS = cli.config_defaults(globals())
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before anything is read or built."""
    cli.check(cfg, at_least_1=("n_show", "n_rvar", "batch_size"), workers=("num_threads",))
    cli.require(bool(cfg.ckpt) != bool(cfg.init_from), "give the checkpoint to inspect: --ckpt=out-vit-cpu/ckpt.pt (a "
                                                   "vit_train.py run's), or --init_from=<a folder export.py wrote>; "
                                                   "one of the two")
    layer_numbers(cfg.layers)


@torch.no_grad()
def rvar_before_after(model, x):
    """x (B, 3, S, S) normalised -> R_var before and after each layer's step, each (B, L),
    and the forward's maps (with "logits")."""
    maps = {}
    logits = model(x, record=maps)
    maps["logits"] = logits
    before, after = zip(*(step_rvar(block, m) for block, m in zip(model.blocks, maps["layers"])))  # L x (B,)
    return torch.stack(before, 1), torch.stack(after, 1), maps


def rvar_over(model, view, indices, dataset_name, bs, dev):
    """Mean (and share lowered) of R_var before/after per layer over view[indices]."""
    before, after = [], []
    for i in tqdm(range(0, len(indices), bs), desc="R_var over images", disable=None, leave=False):  # (a terminal's)
        x = torch.stack([view[j][0] for j in indices[i:i + bs]])
        b, a, _ = rvar_before_after(model, vit_data.to_input(x, dataset_name, dev))
        before.append(b.cpu()), after.append(a.cpu())
    before, after = torch.cat(before).double(), torch.cat(after).double()  # (n, L)
    return {"indices": indices, "before": before.mean(0).tolist(), "after": after.mean(0).tolist(),
            "lowered": (after < before).double().mean(0).tolist()}  # share of images the step lowered


# -----------------------------------------------------------------------------
# figures (rendered to PNG bytes, written at the end)


def map_figure(picture, rows, row_labels, title, scale_label, vmax):
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
    return png_bytes(fig)


# -----------------------------------------------------------------------------


def shown_images(cfg, T, S):
    """(uint8 images (B, 3, S, S), names, true labels or None) to draw; T: the training settings."""
    if cfg.images:
        if not os.path.isdir(cfg.images):
            raise cli.UserError(f"images={cfg.images!r} is not a folder: give --images=<a folder of image files>")
        paths = [os.path.join(cfg.images, f) for f in sorted(os.listdir(cfg.images))
                 if f.lower().endswith(IMAGE_EXTENSIONS)][:cfg.n_show]
        if not paths:
            raise cli.UserError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in {cfg.images}: give "
                                "--images=<a folder of pictures>, or leave it out to show the val split")
        pics = [vit_data.center_crop(vit_data.load_image(p), S, T.eval_crop_pct) for p in paths]
        return torch.stack(pics), paths, [None] * len(paths)
    val = vit_data.build_sources(T)[1]
    view = vit_data.View(val, T, train=False)
    idx = range(min(cfg.n_show, len(val)))
    return torch.stack([view[i][0] for i in idx]), [f"val[{i}]" for i in idx], [val.labels[i] for i in idx]


def main(argv):
    cfg, _ = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    dev, _ = devices.choose_device_dtype(cfg.device, "float32")
    path = cfg.init_from or (os.path.join(cfg.ckpt, "ckpt.pt") if os.path.isdir(cfg.ckpt) else cfg.ckpt)
    out = cfg.out_dir or (hub.beside(cfg.init_from, "inspect") if cfg.init_from else
                        os.path.join(os.path.dirname(os.path.abspath(path)), "inspect"))
    if cfg.init_from:
        hub.check_outside(out, cfg.init_from, "--out_dir", "inspect")
    cli.require(not os.path.exists(out) or os.path.isdir(out),
                f"{out} is a file, not a folder: write the pictures elsewhere with --out_dir=<folder>")
    if not cfg.init_from and not os.path.isfile(path):
        raise cli.UserError(f"no checkpoint at {path}: give --ckpt=<a ckpt.pt written by vit_train.py>")
    out_set = claim_outputs(out, "--out_dir=<another folder>", "vit_inspect.py")  # before any work
    model, ck = (hub.from_pretrained(path, dev, kind="vit") if cfg.init_from else
                 loading.load_vit_model(path, device=dev))
    loading.reader_threads(cfg.num_threads, ck)  # (its setting, else the run's, else the machine's free cores)
    model.eval()
    T = SimpleNamespace(**{**ck["config"], "img_size": model.config.img_size})  # the run's data settings
    S, H, L, is_tost = model.config.img_size, model.config.n_head, model.config.n_layer, model.config.attn == "tssa"
    chosen = layer_numbers(cfg.layers) or sorted({1, (L + 1) // 2, L})
    outside = [l for l in chosen if not 1 <= l <= L]
    cli.require(not outside, f"layers {lists.few(map(str, outside))} out of range: this model has layers 1..{L}")
    shown, sources, truth = shown_images(cfg, T, S)
    x = vit_data.to_input(shown, T.dataset, dev)
    if is_tost:
        before, after, maps = rvar_before_after(model, x)
    else:  # a softmax baseline has no Pi and no R_var: class attention only
        with torch.no_grad():
            maps = {}
            logits = model(x, record=maps)
        maps["logits"] = logits
    Hp, Wp = maps["grid"]
    classes = ck.get("classes") or [str(k) for k in range(model.config.num_classes)]
    probs = maps["logits"].float().softmax(-1).cpu()
    report = {"checkpoint": os.path.abspath(path), "iter": ck.get("iter_num"), "attn": model.config.attn,
              "grid": [Hp, Wp], "layers_shown": chosen, "images": [], "files": []}
    pictures = {}  # file name -> PNG bytes
    for i in range(len(shown)):
        entry = {"source": sources[i], "predicted": classes[int(probs[i].argmax())], "p": float(probs[i].max()),
                 "true": None if truth[i] is None else classes[truth[i]]}
        title = (f"true: {entry['true']}, " if entry["true"] else "") + f"predicted: {entry['predicted']}"
        picture = shown[i].permute(1, 2, 0).numpy()
        if is_tost:
            rows = [maps["layers"][l - 1]["pi"][i].view(H, Hp, Wp).cpu().numpy() for l in chosen]
            pictures[f"pi_{i:02d}.png"] = map_figure(
                picture, rows, [f"layer {l}" for l in chosen],
                f"Pi (membership of each patch in each head's group); {title}", "Pi", 1.0)
            entry["rvar_before"], entry["rvar_after"] = before[i].tolist(), after[i].tolist()
        attn = maps["cls_attn"][0][i].view(H, Hp, Wp).cpu().numpy()
        pictures[f"cls_attn_{i:02d}.png"] = map_figure(picture, [attn], ["class attention, layer 1"],
                                                       f"class-token attention over the patches; {title}",
                                                       "attention weight", float(attn.max()))
        report["images"].append(entry)
    if is_tost:  # Figure 4a on train and val images, a fixed subset of each
        report["rvar"] = {}
        for split, src in zip(("train", "val"), vit_data.build_sources(T)):
            indices = torch.randperm(len(src), generator=torch.Generator().manual_seed(0))[:cfg.n_rvar].tolist()
            view = vit_data.View(src, T, train=False)
            report["rvar"][split] = rvar_over(model, view, indices, T.dataset, cfg.batch_size, dev)
        pictures["rvar.png"] = rvar_figure(report["rvar"], list(range(1, L + 1)),
                                           f"{len(report['rvar']['val']['indices'])} images",
                                           f"{path}: {L} ToST layers, iteration {ck.get('iter_num')}")
        print("R_var after each layer's step (val):", " ".join(f"{v:.4g}" for v in report["rvar"]["val"]["after"]))
        print("share of val images the step lowered, by layer:",
              " ".join(f"{100 * v:.0f}%" for v in report["rvar"]["val"]["lowered"]))
    report["files"] = sorted(pictures)
    replaced = write_outputs(out_set, pictures, report)
    print(f"wrote {len(pictures)} pictures and inspect.json to {out}" + (" (replacing the earlier set)" if replaced else ""))
    return report


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
