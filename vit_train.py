"""
Train, fine-tune or benchmark ToST-ViT (the Token Statistics Transformer for images), or the
softmax-attention baseline of the same size (--attn=softmax), for image classification.

    python vit_train.py config/vit_cpu.py                  # CPU, built-in "shapes" data, minutes
    torchrun --standalone --nproc_per_node=8 vit_train.py config/vit_tost_s.py   # ImageNet-1k
    python vit_train.py config/vit_tost_s.py --init_from=finetune \\
        --finetune_from=out-vit-tost-s/ckpt.pt --dataset=cifar10 --out_dir=out-vit-s-c10 ...
    python vit_train.py config/vit_tost_s.py --bench=True  # ToST vs softmax, growing images

Settings are the module globals below, overridden by config files (positional arguments) and
then --key=value (trainkit.configure: unknown keys and bad values get a clear error).

Data (`dataset`):
  "shapes"       built in, no download: ten shapes drawn with numpy at random size, rotation,
                 position and colours on textured backgrounds; the label is the shape.
                 Deterministic by shapes_seed. A real task (chance is 1/10), learnable on a CPU.
  "cifar10", "cifar100", "imagenet-1k"   through Hugging Face `datasets` (needs the network
                 the first time, and Pillow to decode; ImageNet-1k is gated: accept its terms
                 on the Hub and log in with `huggingface-cli login`).
  "folder"       data_dir/train/<class>/*.png|jpg... and data_dir/val/<class>/... (or one tree
                 of class folders, of which val_fraction of each class is held out). PNG and
                 .npy decode without any imaging library; other formats need Pillow.

Pipeline: the loader makes a random resized crop per image (its randomness is a function of
seed, epoch and image index, so it does not depend on worker count or order); on the device,
per batch: horizontal flip, RandAugment-lite, normalisation, then mixup / cutmix on targets
smoothed by label_smoothing (notes §6). Every random draw is a function of (seed, step, rank)
or of the saved RNG state, so a resumed run repeats the uninterrupted one exactly.

Checkpoints (out_dir/ckpt.pt) are written atomically and hold the model, optimizer, step,
settings and RNG states; init_from="resume" continues exactly. Evaluations and training
losses go to out_dir/log.jsonl, one JSON object per line.
"""

import math
import os
import socket
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import pngio
import trainkit
from model import ToSTViT, ViTConfig, make_attention

# -----------------------------------------------------------------------------
# default settings (a config file and --key=value override them)
# I/O
out_dir = "out-vit"
init_from = "scratch"  # "scratch" | "resume" (out_dir/ckpt.pt) | "finetune" (finetune_from, new head)
finetune_from = ""  # the checkpoint init_from="finetune" starts from
eval_interval = 500  # iterations between evaluations (and checkpoints)
log_interval = 20  # iterations between progress lines / train records in the log
eval_max_images = 0  # 0: evaluate on the whole validation split
always_save_checkpoint = True  # False: save only when val top-1 improves
# data
dataset = "shapes"  # "shapes" | "cifar10" | "cifar100" | "imagenet-1k" | "folder"
data_dir = ""  # dataset="folder": the image tree
val_fraction = 0.1  # dataset="folder" without train/ and val/: share of each class held out
img_size = 32  # training and evaluation resolution
num_workers = 0  # DataLoader worker processes (decoding and cropping)
shapes_train_size = 20000
shapes_val_size = 2000
shapes_num_classes = 10  # 2..10
shapes_source_size = 32  # resolution the shapes are drawn at
shapes_seed = 0
# augmentation (notes §6); each one has its switch
crop_scale = (0.08, 1.0)  # random resized crop: range of the crop's area; (1.0, 1.0) = off
hflip = True
randaug_n = 2  # RandAugment-lite: operations per image; 0 = off
randaug_m = 9.0  # magnitude on RandAugment's 0..10 scale (per image ~ N(m, 0.5))
mixup = 0.8  # mixup alpha; 0 = off
cutmix = 1.0  # cutmix alpha; 0 = off
mix_prob = 1.0  # probability that a batch is mixed (mixup or cutmix, half and half if both on)
label_smoothing = 0.1
eval_crop_pct = 0.875  # evaluation: resize the short side to img_size / eval_crop_pct, centre crop
# model (ignored for init_from="resume"/"finetune": the checkpoint's architecture is used)
n_layer = 6
n_head = 4
n_embd = 192
patch_size = 4
mlp_ratio = 4.0
dropout = 0.0
drop_path = 0.0  # stochastic depth of the last block
layer_scale_init = 1.0
attn = "tssa"  # "tssa" | "softmax" (the ViT baseline at equal size)
pi = "softmax"  # "softmax" | "uniform" (ablation)
n_cls_layers = 2
# optimisation
batch_size = 128  # images per micro-step per process
gradient_accumulation_steps = 1  # micro-steps per optimizer step, summed over all processes
max_iters = 5000
learning_rate = 1e-3
min_lr = 1e-5
warmup_iters = 250
lr_decay_iters = 0  # 0: max_iters
lr_schedule = "cosine"
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.999
grad_clip = 1.0  # 0: off
# system
device = ""  # "" = cuda when available, else cpu
dtype = "auto"  # "auto" (bfloat16 on a GPU that has it, else float32) | "float32" | "bfloat16" | "float16"
compile = False
num_threads = 0  # CPU threads for torch ops (0: torch's default). Small models on a busy or small CPU: 1
sync_bn = True  # under DDP on GPUs: SyncBatchNorm in the convolutional patch embedding
seed = 1337
# benchmark mode (--bench=True): forward time and peak memory, softmax vs TSSA
bench = False
bench_sizes = (224, 448, 896, 1344, 1792, 2048)  # image sides; tokens = (side / patch_size)^2
bench_scope = "attention"  # "attention": n_layer attention layers alone | "model": the whole ViT
bench_batch = 1
bench_repeats = 3
bench_time_limit = 60.0  # seconds: skip a measurement predicted (quadratically) to take longer
DEFAULTS = trainkit.config_defaults(globals())
# -----------------------------------------------------------------------------

HF_DATASETS = {  # name -> (hub id, image column, label column, train split, val split)
    "cifar10": ("uoft-cs/cifar10", "img", "label", "train", "test"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label", "train", "test"),
    "imagenet-1k": ("ILSVRC/imagenet-1k", "image", "label", "train", "validation"),
}
NORMALISATION = {  # per-channel (mean, std) of the pixels in [0, 1]
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
IMAGE_EXTENSIONS = (".png", ".npy", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")

try:  # optional: decodes every image format (it comes with `pip install datasets[vision]`)
    from PIL import Image as PILImage
except ImportError:  # pragma: no cover - depends on the environment
    PILImage = None


def normalisation_for(name):
    if name == "shapes":
        return NORMALISATION["half"]
    return NORMALISATION["cifar" if name.startswith("cifar") else "imagenet"]


# -----------------------------------------------------------------------------
# 1. Images from disk: PNG through pngio.py (no imaging library needed), Pillow for the rest

def load_image(path):
    """Any image file -> uint8 tensor (3, H, W), RGB."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        pixels = np.load(path)
    elif PILImage is not None:
        with PILImage.open(path) as im:
            pixels = np.asarray(im.convert("RGB"))
    elif ext == ".png":
        with open(path, "rb") as f:
            pixels = pngio.decode_png(f.read())
    else:
        raise RuntimeError(f"decoding {ext} files needs Pillow (pip install Pillow); only PNG and .npy "
                           f"decode without it ({path})")
    pixels = np.asarray(pixels)
    if pixels.dtype == np.uint16:  # 16-bit PNG: keep the high byte
        pixels = pixels >> 8
    pixels = np.array(pixels, dtype=np.uint8)  # a writable copy
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.shape[2] in (2, 4):  # drop alpha
        pixels = pixels[:, :, :-1]
    if pixels.shape[2] == 1:
        pixels = pixels.repeat(3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).contiguous()  # (3, H, W)


# -----------------------------------------------------------------------------
# 2. The built-in procedural dataset: shapes

SHAPES = ("disk", "ring", "triangle", "plus", "pair", "star", "square", "frame", "ellipse", "crescent")


def _shape_mask(kind, u, v):
    """Inside-mask of a shape of radius 1 in its own rotated frame; u, v: (n, S, S)."""
    r = torch.sqrt(u * u + v * v)
    box = torch.maximum(u.abs(), v.abs())
    if kind == "disk":
        return r <= 1
    if kind == "ring":
        return (r <= 1) & (r >= 0.55)
    if kind == "square":
        return box <= 0.8
    if kind == "frame":
        return (box <= 0.85) & (box >= 0.5)
    if kind == "triangle":  # equilateral, inscribed in the unit circle
        return (v >= -0.5) & (0.866 * u + 0.5 * v <= 0.5) & (-0.866 * u + 0.5 * v <= 0.5)
    if kind == "plus":
        return ((u.abs() <= 0.3) & (v.abs() <= 1)) | ((v.abs() <= 0.3) & (u.abs() <= 1))
    if kind == "star":
        return r <= 0.55 + 0.4 * torch.cos(5 * torch.atan2(v, u))
    if kind == "ellipse":
        return u * u + (v / 0.45) ** 2 <= 1
    if kind == "pair":
        return ((u - 0.55) ** 2 + v * v <= 0.16) | ((u + 0.55) ** 2 + v * v <= 0.16)
    if kind == "crescent":
        return (r <= 1) & ((u - 0.45) ** 2 + v * v >= 0.5625)
    raise ValueError(kind)


def make_shapes(n, size=32, num_classes=10, seed=0, chunk=1000):
    """n images (uint8 (n, 3, size, size)) and labels ((n,) int64): one shape per image at a
    random position, radius, rotation and colour, on a two-colour gradient with noise; the
    label is the shape. Same (n, size, num_classes, seed) -> same tensors, on any machine."""
    if not 2 <= num_classes <= len(SHAPES):
        raise ValueError(f"shapes_num_classes must be in 2..{len(SHAPES)}, got {num_classes}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % num_classes
    labels = labels[torch.randperm(n, generator=g)]
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)
    S2 = 2 * size  # drawn at twice the size, then averaged 2x2 (anti-aliasing)
    coords = (torch.arange(S2, dtype=torch.float32) + 0.5) / 2  # pixel centres in output units
    for start in range(0, n, chunk):
        lab = labels[start:start + chunk]
        m = lab.numel()
        rand = lambda *shape: torch.rand(*shape, generator=g)
        radius = size * (0.22 + 0.16 * rand(m))  # (m,)
        cx = radius + 1 + (size - 2 * radius - 2) * rand(m)
        cy = radius + 1 + (size - 2 * radius - 2) * rand(m)
        angle = 2 * math.pi * rand(m)
        dx = (coords[None, None, :] - cx[:, None, None]) / radius[:, None, None]  # (m, 1, S2)
        dy = (coords[None, :, None] - cy[:, None, None]) / radius[:, None, None]  # (m, S2, 1)
        cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
        u, v = cos * dx + sin * dy, -sin * dx + cos * dy  # (m, S2, S2)
        mask = torch.zeros(m, S2, S2)
        for k in range(num_classes):
            sel = lab == k
            if sel.any():
                mask[sel] = _shape_mask(SHAPES[k], u[sel], v[sel]).float()
        mask = F.avg_pool2d(mask[:, None], 2)  # (m, 1, size, size) in [0, 1]
        # background: gradient between two colours along a random direction, plus noise
        c0, c1 = rand(m, 3, 1, 1), rand(m, 3, 1, 1)
        theta = 2 * math.pi * rand(m, 1, 1, 1)
        ramp = torch.linspace(0, 1, size)
        t = (theta.cos() * ramp[None, None, None, :] + theta.sin() * ramp[None, None, :, None] + 1) / 3
        bg = c0 + (c1 - c0) * t + 0.05 * torch.randn(m, 3, size, size, generator=g)
        # foreground: a colour that stands out from the background's mean brightness
        fg = rand(m, 3, 1, 1)
        low_contrast = (fg.mean(1) - bg.mean((1, 2, 3))[:, None, None]).abs() < 0.25  # (m, 1, 1)
        fg = torch.where(low_contrast[:, None], 1 - bg.mean((2, 3), keepdim=True), fg)
        fg = fg + 0.05 * torch.randn(m, 3, size, size, generator=g)
        img = mask * fg + (1 - mask) * bg
        images[start:start + m] = (img.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


# -----------------------------------------------------------------------------
# 3. Datasets: sources of (image, label), views that crop them


class TensorSource:
    """Images held in memory: uint8 (N, 3, H, W)."""

    def __init__(self, images, labels, classes):
        self.images, self.labels, self.classes = images, torch.as_tensor(labels), list(classes)

    def __len__(self):
        return len(self.labels)

    def get(self, i):
        return self.images[i], int(self.labels[i])


class FileSource:
    """Image files on disk, decoded on demand (in the DataLoader workers)."""

    def __init__(self, paths, labels, classes):
        self.paths, self.labels, self.classes = paths, labels, list(classes)

    def __len__(self):
        return len(self.paths)

    def get(self, i):
        return load_image(self.paths[i]), self.labels[i]


class HFSource:
    """A Hugging Face dataset split, decoded on demand (ImageNet-1k)."""

    def __init__(self, ds, image_key, label_key, classes):
        self.ds, self.image_key, self.label_key, self.classes = ds, image_key, label_key, list(classes)

    def __len__(self):
        return len(self.ds)

    def get(self, i):
        row = self.ds[int(i)]
        pixels = np.asarray(row[self.image_key].convert("RGB"), dtype=np.uint8)
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), int(row[self.label_key])


def scan_image_folder(root):
    """root/<class>/<files> -> (paths, labels, classes), classes sorted by name."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    paths, labels = [], []
    for k, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name))):
            for f in sorted(files):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(dirpath, f))
                    labels.append(k)
    if not paths:
        raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in class sub-folders of {root!r}; "
                                "expected root/<class name>/<image files>")
    return paths, labels, classes


def folder_sources(data_dir, val_fraction):
    """data_dir/train + data_dir/val (or validation/test), or one tree split per class."""
    if not data_dir or not os.path.isdir(data_dir):
        raise FileNotFoundError(f"dataset='folder' needs data_dir=<a folder>, got {data_dir!r}; it should hold "
                                "train/<class>/<images> and val/<class>/<images>, or just <class>/<images>")
    train_dir = os.path.join(data_dir, "train")
    val_dir = next((os.path.join(data_dir, d) for d in ("val", "validation", "test")
                    if os.path.isdir(os.path.join(data_dir, d))), None)
    if os.path.isdir(train_dir) and val_dir:
        tp, tl, classes = scan_image_folder(train_dir)
        vp, vl, vclasses = scan_image_folder(val_dir)
        unknown = sorted(set(vclasses) - set(classes))
        if unknown:
            raise ValueError(f"{val_dir} has classes that train/ lacks: {unknown[:5]}")
        vl = [classes.index(vclasses[k]) for k in vl]
        return FileSource(tp, tl, classes), FileSource(vp, vl, classes)
    paths, labels, classes = scan_image_folder(data_dir)
    train, val = ([], []), ([], [])
    for k in range(len(classes)):  # the last val_fraction of each class (in name order) is held out
        mine = [p for p, lab in zip(paths, labels) if lab == k]
        n_val = int(round(val_fraction * len(mine)))
        for split, chosen in ((train, mine[:len(mine) - n_val]), (val, mine[len(mine) - n_val:])):
            split[0].extend(chosen)
            split[1].extend([k] * len(chosen))
    return FileSource(*train, classes), FileSource(*val, classes)


def _hub_reachable(timeout=3.0):
    """Whether the Hugging Face Hub answers (False at once in offline mode)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "") or os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", ""):
        return False
    from urllib.parse import urlparse
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hf_sources(name):
    """CIFAR-10/100 (decoded into memory once) or ImageNet-1k (decoded on demand)."""
    hub_id, image_key, label_key, train_split, val_split = HF_DATASETS[name]
    if PILImage is None:
        raise RuntimeError(f"dataset={name!r} needs Pillow to decode the images: pip install Pillow "
                           "(or pip install 'datasets[vision]')")
    if not _hub_reachable():  # use the local cache, or fail now instead of retrying for long
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets
    try:
        splits = [datasets.load_dataset(hub_id, split=s) for s in (train_split, val_split)]
    except Exception as e:  # no network, offline mode, gated repository, ...
        raise RuntimeError(
            f"could not load {hub_id!r} through Hugging Face datasets ({type(e).__name__}: {str(e)[:300]}). "
            "It needs the network the first time (and for imagenet-1k: accepting its terms on the Hub and "
            "`huggingface-cli login`). Without it: dataset='folder' with data_dir=<image tree>, or "
            "dataset='shapes' (built in).") from e
    classes = splits[0].features[label_key].names
    if name == "imagenet-1k":
        return tuple(HFSource(ds, image_key, label_key, classes) for ds in splits)
    sources = []
    for ds in splits:
        images = torch.from_numpy(np.stack([np.asarray(im.convert("RGB")) for im in ds[image_key]]))
        sources.append(TensorSource(images.permute(0, 3, 1, 2).contiguous(), ds[label_key], classes))
    return tuple(sources)


def build_sources(cfg):
    """(train source, val source) for cfg["dataset"]."""
    name = cfg["dataset"]
    if name == "shapes":
        n_cls, size = cfg["shapes_num_classes"], cfg["shapes_source_size"]
        classes = SHAPES[:n_cls]
        tr = make_shapes(cfg["shapes_train_size"], size, n_cls, seed=2 * cfg["shapes_seed"])
        va = make_shapes(cfg["shapes_val_size"], size, n_cls, seed=2 * cfg["shapes_seed"] + 1)
        return TensorSource(*tr, classes), TensorSource(*va, classes)
    if name == "folder":
        return folder_sources(cfg["data_dir"], cfg["val_fraction"])
    if name in HF_DATASETS:
        return hf_sources(name)
    raise trainkit.ConfigError(f"unknown dataset {name!r}; use shapes, folder (with data_dir), "
                               f"or one of {sorted(HF_DATASETS)}")


def resize(img, size):
    """uint8 (3, H, W) -> uint8 (3, size[0], size[1]), bilinear with antialiasing."""
    if tuple(img.shape[1:]) == tuple(size):
        return img
    out = F.interpolate(img[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].round().clamp(0, 255).to(torch.uint8)


def random_resized_crop_box(H, W, scale, rng, ratio=(3 / 4, 4 / 3)):
    """(top, left, h, w) of a crop with area in scale * H * W and aspect ratio in ratio
    (log-uniform); after 10 failed tries the largest centred crop within the ratios."""
    for _ in range(10):
        area = H * W * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if 0 < w <= W and 0 < h <= H:
            return int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w
    aspect = W / H
    w, h = (W, int(round(W / ratio[0]))) if aspect < ratio[0] else (
        (int(round(H * ratio[1])), H) if aspect > ratio[1] else (W, H))
    h, w = min(h, H), min(w, W)
    return (H - h) // 2, (W - w) // 2, h, w


def center_crop(img, size, crop_pct):
    """Resize the short side to size / crop_pct, then take the centre size x size."""
    H, W = img.shape[1:]
    short = int(round(size / crop_pct))
    if min(H, W) != short:
        scale = short / min(H, W)
        img = resize(img, (max(size, int(round(H * scale))), max(size, int(round(W * scale)))))
    H, W = img.shape[1:]
    top, left = (H - size) // 2, (W - size) // 2
    return img[:, top:top + size, left:left + size]


class CropView(torch.utils.data.Dataset):
    """A source seen at img_size: random resized crop (train) or centre crop (eval).
    Keys are epoch * len(source) + index, so a crop depends only on (seed, epoch, index)."""

    def __init__(self, source, img_size, train, crop_scale=(0.08, 1.0), crop_pct=0.875, seed=0):
        self.source, self.size, self.train = source, img_size, train
        self.crop_scale, self.crop_pct, self.seed = tuple(crop_scale), crop_pct, seed

    def __len__(self):
        return len(self.source)

    def __getitem__(self, key):
        epoch, index = divmod(int(key), len(self.source))
        img, label = self.source.get(index)
        if not self.train:
            return center_crop(img, self.size, self.crop_pct), label
        if self.crop_scale != (1.0, 1.0):
            rng = np.random.default_rng([self.seed, epoch, index])
            top, left, h, w = random_resized_crop_box(img.shape[1], img.shape[2], self.crop_scale, rng)
            img = img[:, top:top + h, left:left + w]
        return resize(img, (self.size, self.size)), label


class TrainBatches:
    """Micro-batches of keys for one process, from micro-step `start` on: each epoch a fresh
    permutation (same on every rank, seeded by seed + epoch), split into disjoint rank shards."""

    def __init__(self, n, batch_size, rank, world_size, seed, start=0):
        self.n, self.bs, self.rank, self.seed, self.start = n, batch_size, rank, seed, start
        self.per_rank = n // world_size
        self.steps_per_epoch = self.per_rank // batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training set ({n} images over {world_size} processes) is smaller than one "
                             f"batch ({batch_size}); lower batch_size")

    def __iter__(self):
        step = self.start
        while True:
            epoch, b0 = divmod(step, self.steps_per_epoch)
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch))
            mine = perm[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]
            for b in range(b0, self.steps_per_epoch):
                yield (epoch * self.n + mine[b * self.bs:(b + 1) * self.bs]).tolist()
            step = (epoch + 1) * self.steps_per_epoch


def make_loader(view, batch_sampler, num_workers, pin_memory=False):
    # the loader's own generator: creating its iterator must not draw from the global RNG
    return torch.utils.data.DataLoader(view, batch_sampler=batch_sampler, num_workers=num_workers,
                                       pin_memory=pin_memory, generator=torch.Generator().manual_seed(0),
                                       persistent_workers=False)


def eval_loader(source, cfg, rank=0, world_size=1):
    view = CropView(source, cfg["img_size"], train=False, crop_pct=cfg["eval_crop_pct"])
    n = len(source) if cfg["eval_max_images"] <= 0 else min(len(source), cfg["eval_max_images"])
    mine = list(range(rank, n, world_size))
    batches = [mine[i:i + cfg["batch_size"]] for i in range(0, len(mine), cfg["batch_size"])]
    return make_loader(view, batches, cfg["num_workers"])


# -----------------------------------------------------------------------------
# 4. Augmentation on the device (batches of floats in [0, 1])

RANDAUG_OPS = ("identity", "autocontrast", "equalize", "rotate", "solarize", "color", "posterize",
               "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")


def _blend(img, degenerate, factor):  # PIL ImageEnhance: degenerate + factor * (img - degenerate)
    return (degenerate + factor.view(-1, 1, 1, 1) * (img - degenerate)).clamp(0, 1)


def _grey(x):  # (n, 3, H, W) -> (n, 1, H, W), ITU-R 601 luma
    return (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).unsqueeze(1)


def _affine(x, theta):
    """Warp (n, 3, H, W) by per-image affine maps theta (n, 2, 3) (output -> input, in [-1, 1]
    coordinates), filling uncovered pixels with grey 0.5."""
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x - 0.5, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + 0.5


def _equalize(x):
    """Histogram equalisation of each channel of each image (8-bit levels)."""
    n, C, H, W = x.shape
    levels = (x * 255).round().long().view(n * C, H * W)
    hist = torch.zeros(n * C, 256, device=x.device).scatter_add_(1, levels, torch.ones_like(levels, dtype=torch.float))
    cdf = hist.cumsum(1)
    cdf_min = cdf.masked_fill(hist == 0, float(H * W)).amin(1, keepdim=True)  # count of the darkest level
    lut = ((cdf - cdf_min) / (H * W - cdf_min).clamp_min(1) * 255).round().clamp(0, 255)
    out = lut.gather(1, levels).view(n, C, H, W) / 255
    flat = (cdf_min == H * W).view(n, C, 1, 1)  # a constant channel stays as it is
    return torch.where(flat, x, out)


def apply_op(name, x, m, sign):
    """One RandAugment operation on images x (n, 3, H, W) at magnitudes m (n,) in [0, 1],
    with signs (n,) of +-1 for the operations that have a direction."""
    n = x.shape[0]
    if name == "autocontrast":
        lo, hi = x.amin((2, 3), keepdim=True), x.amax((2, 3), keepdim=True)
        return torch.where(hi > lo, (x - lo) / (hi - lo).clamp_min(1e-6), x)
    if name == "equalize":
        return _equalize(x)
    if name == "solarize":  # invert the pixels above a threshold that falls with m
        return torch.where(x >= (1 - m).view(-1, 1, 1, 1), 1 - x, x)
    if name == "posterize":  # keep 8 - 4m bits
        step = (2.0 ** (4 * m).round()).view(-1, 1, 1, 1)  # 2 ** (bits dropped)
        return torch.floor(x * 255 / step) * step / 255
    factor = 1 + 0.9 * m * sign
    if name == "color":
        return _blend(x, _grey(x).expand_as(x), factor)
    if name == "contrast":
        return _blend(x, _grey(x).mean((2, 3), keepdim=True).expand_as(x), factor)
    if name == "brightness":
        return _blend(x, torch.zeros_like(x), factor)
    if name == "sharpness":  # against PIL's 3x3 smoothing filter
        kernel = torch.tensor([[1., 1., 1.], [1., 5., 1.], [1., 1., 1.]], device=x.device) / 13
        blurred = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel.expand(3, 1, 3, 3), groups=3)
        return _blend(x, blurred, factor)
    theta = torch.zeros(n, 2, 3, device=x.device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1
    s = (m * sign).to(x.device)
    if name == "rotate":  # up to 30 degrees
        a = s * math.radians(30)
        theta[:, 0, 0], theta[:, 0, 1], theta[:, 1, 0], theta[:, 1, 1] = a.cos(), -a.sin(), a.sin(), a.cos()
    elif name == "shear_x":
        theta[:, 0, 1] = 0.3 * s
    elif name == "shear_y":
        theta[:, 1, 0] = 0.3 * s
    elif name == "translate_x":  # up to 45% of the side ([-1, 1] spans the side twice over)
        theta[:, 0, 2] = 2 * 0.45 * s
    elif name == "translate_y":
        theta[:, 1, 2] = 2 * 0.45 * s
    else:
        raise ValueError(f"unknown RandAugment op {name!r}")
    return _affine(x, theta)


def rand_augment(x, n_ops, magnitude, gen):
    """RandAugment-lite: each image gets n_ops operations drawn uniformly from RANDAUG_OPS, at
    a magnitude ~ N(magnitude, 0.5) clipped to [0, 10] (as "rand-m9-mstd0.5"). x: (B, 3, H, W)
    in [0, 1]; gen: a CPU torch.Generator (all draws come from it)."""
    B = x.shape[0]
    for _ in range(n_ops):
        op = torch.randint(len(RANDAUG_OPS), (B,), generator=gen)
        m = ((magnitude + 0.5 * torch.randn(B, generator=gen)).clamp(0, 10) / 10).to(x.device)
        sign = torch.where(torch.rand(B, generator=gen) < 0.5, -1.0, 1.0).to(x.device)
        for k, name in enumerate(RANDAUG_OPS[1:], start=1):
            idx = (op == k).nonzero().squeeze(1).to(x.device)
            if idx.numel():
                x[idx] = apply_op(name, x[idx], m[idx], sign[idx])
    return x


def mix_batch(x, target, rng, mixup_alpha, cutmix_alpha, prob):
    """Mixup or cutmix of the batch with its reverse; x (B, 3, H, W), target (B, K) soft
    labels; rng: numpy Generator. Returns (x, target, lam) with lam the share of each image's
    own content (1.0 when the batch is left alone)."""
    if (mixup_alpha <= 0 and cutmix_alpha <= 0) or rng.random() >= prob:
        return x, target, 1.0
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < 0.5)
    lam = float(rng.beta(cutmix_alpha, cutmix_alpha) if use_cutmix else rng.beta(mixup_alpha, mixup_alpha))
    other = x.flip(0)
    if use_cutmix:  # paste a box of area ~ (1 - lam) from the partner image
        H, W = x.shape[2:]
        cut = math.sqrt(1 - lam)
        ch, cw = int(H * cut), int(W * cut)
        cy, cx = int(rng.integers(H)), int(rng.integers(W))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, H)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, W)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = other[:, :, y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)  # the area actually pasted
    else:
        x = lam * x + (1 - lam) * other
    return x, lam * target + (1 - lam) * target.flip(0), lam


def smooth_targets(labels, num_classes, smoothing):
    return F.one_hot(labels, num_classes).float() * (1 - smoothing) + smoothing / num_classes


def step_seed(seed, step, rank):
    """A 63-bit seed that is a function of (seed, micro-step, rank) only."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def prepare_batch(images, labels, cfg, num_classes, step, rank, dev):
    """uint8 images (B, 3, S, S) and int labels -> normalised floats and soft targets, with
    the training augmentation of cfg; random draws are a function of (seed, step, rank)."""
    s = step_seed(cfg["seed"], step, rank)
    gen, rng = torch.Generator().manual_seed(s), np.random.default_rng(s)
    x = images.to(dev, non_blocking=True).float() / 255  # (B, 3, S, S) in [0, 1]
    if cfg["hflip"]:
        flip = (torch.rand(x.shape[0], generator=gen) < 0.5).to(dev).view(-1, 1, 1, 1)
        x = torch.where(flip, x.flip(-1), x)
    if cfg["randaug_n"] > 0:
        x = rand_augment(x, cfg["randaug_n"], cfg["randaug_m"], gen)
    x = normalise(x, cfg["dataset"])
    target = smooth_targets(labels.to(dev), num_classes, cfg["label_smoothing"])
    x, target, _ = mix_batch(x, target, rng, cfg["mixup"], cfg["cutmix"], cfg["mix_prob"])
    return x, target


def normalise(x, dataset_name):
    mean, std = (torch.tensor(v, device=x.device).view(1, 3, 1, 1) for v in normalisation_for(dataset_name))
    return (x - mean) / std


def soft_cross_entropy(logits, target):
    """Cross-entropy against soft targets (B, K), in fp32."""
    return -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


# -----------------------------------------------------------------------------
# 5. Model, checkpoints, evaluation

MODEL_KEYS = ("img_size", "patch_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "dropout", "drop_path",
              "layer_scale_init", "attn", "pi", "n_cls_layers")


def model_from_checkpoint(ckpt, **overrides):
    """Rebuild the model a checkpoint of this script holds (on the CPU)."""
    model = ToSTViT(ViTConfig(**{**ckpt["model_args"], **overrides}))
    model.load_state_dict(trainkit.clean_state_dict(ckpt["model"]))
    return model


def build_model(cfg, num_classes, is_master):
    """(model, checkpoint or None) for init_from = scratch / resume / finetune."""
    if cfg["init_from"] == "scratch":
        args = {k: cfg[k] for k in MODEL_KEYS}
        return ToSTViT(ViTConfig(**args, num_classes=num_classes)), None
    if cfg["init_from"] == "resume":
        ckpt = trainkit.load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
        return model_from_checkpoint(ckpt), ckpt
    if cfg["init_from"] == "finetune":
        if not cfg["finetune_from"]:
            raise trainkit.ConfigError("init_from='finetune' needs finetune_from=<path to a ckpt.pt>")
        ckpt = trainkit.load_checkpoint(cfg["finetune_from"])
        # architecture from the checkpoint; resolution and regularisation from this run
        model = model_from_checkpoint(ckpt, img_size=cfg["img_size"], dropout=cfg["dropout"],
                                      drop_path=cfg["drop_path"])
        if model.config.num_classes != num_classes:
            if is_master:
                print(f"fine-tuning: new head, {model.config.num_classes} -> {num_classes} classes")
            model.reset_classifier(num_classes)
        return model, None
    raise trainkit.ConfigError(f"init_from must be scratch, resume or finetune, got {cfg['init_from']!r}")


@torch.no_grad()
def evaluate(model, loader, dev, ctx, d, dataset_name):
    """Top-1 accuracy and cross-entropy over the whole loader, summed over all processes."""
    model.eval()
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # correct, loss sum, count
    for images, labels in loader:
        x = normalise(images.to(dev).float() / 255, dataset_name)
        labels = labels.to(dev)
        with ctx():
            logits = model(x)
        sums[0] += (logits.argmax(-1) == labels).sum()
        sums[1] += F.cross_entropy(logits.float(), labels, reduction="sum")
        sums[2] += labels.numel()
    if d.ddp:
        torch.distributed.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def resolve_dtype(name, dev):
    if name != "auto":
        return name
    if dev.startswith("cuda") and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


# -----------------------------------------------------------------------------
# 6. Training


def train(cfg):
    d = trainkit.setup_distributed(cfg["device"] or None)
    try:
        result = _train(cfg, d)
    except BaseException:
        trainkit.cleanup_distributed(d, wait=False)
        raise
    trainkit.cleanup_distributed(d)
    return result


def _train(cfg, d):
    dev = d.device
    accum = cfg["gradient_accumulation_steps"]
    if accum % d.world_size:
        raise trainkit.ConfigError(f"gradient_accumulation_steps ({accum}) must be divisible by the number of "
                                   f"processes ({d.world_size})")
    accum //= d.world_size  # micro-steps per process
    torch.manual_seed(cfg["seed"] + d.rank)
    np.random.seed(cfg["seed"] + d.rank)
    dtype_name = resolve_dtype(cfg["dtype"], dev)
    ctx, scaler = trainkit.autocast_for(dev, dtype_name)

    train_src, val_src = build_sources(cfg)
    num_classes = len(train_src.classes)
    model, ckpt = build_model(cfg, num_classes, d.is_master)
    if ckpt is not None and ckpt["model_args"]["num_classes"] != num_classes:
        raise ValueError(f"the checkpoint has {ckpt['model_args']['num_classes']} classes but dataset "
                         f"{cfg['dataset']!r} has {num_classes}; use init_from='finetune' for a new head")
    model.to(dev)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                           "cuda" if dev.startswith("cuda") else "cpu")
    iter_num, best_top1, resumed_at = 0, 0.0, None
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        iter_num, best_top1 = ckpt["iter_num"], ckpt["best_val_top1"]
        resumed_at = iter_num  # the checkpoint was written right after evaluating at this iteration
        states = ckpt["rng"]
        trainkit.set_rng_state(states[d.rank] if len(states) == d.world_size else states[0])
        del ckpt
    raw_model = model
    if d.ddp and cfg["sync_bn"] and dev.startswith("cuda"):
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        raw_model = model
    if cfg["compile"]:
        model = torch.compile(model)
    if d.ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[d.local_rank] if dev.startswith("cuda") else None)

    view = CropView(train_src, cfg["img_size"], train=True, crop_scale=cfg["crop_scale"], seed=cfg["seed"])
    micro_step = iter_num * accum  # the data position is a function of the iteration
    batches = TrainBatches(len(train_src), cfg["batch_size"], d.rank, d.world_size, cfg["seed"], start=micro_step)
    train_iter = iter(make_loader(view, batches, cfg["num_workers"], pin_memory=dev.startswith("cuda")))
    val_loader = eval_loader(val_src, cfg, d.rank, d.world_size)
    logger = trainkit.JsonlLogger(os.path.join(cfg["out_dir"], "log.jsonl"), enabled=d.is_master)
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    if d.is_master:
        print(f"{cfg['attn']} ViT: {raw_model.get_num_params() / 1e6:.2f}M parameters, {num_classes} classes, "
              f"{len(train_src)} train / {len(val_src)} val images, {d.world_size} process(es) on {dev}, "
              f"{dtype_name}, batch {cfg['batch_size'] * accum * d.world_size}")

    def save(val_top1):
        states = trainkit.gather_rng_states(d)  # every rank takes part
        if d.is_master:
            trainkit.save_checkpoint({
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "model_args": {**{k: getattr(raw_model.config, k) for k in MODEL_KEYS},
                               "num_classes": raw_model.config.num_classes},
                "iter_num": iter_num, "best_val_top1": best_top1, "val_top1": val_top1,
                "config": cfg, "classes": train_src.classes, "rng": states}, os.path.join(cfg["out_dir"], "ckpt.pt"))

    result, t0, loss_window = {}, time.time(), []
    while True:
        due = iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]
        if due and iter_num != resumed_at:  # (a resumed run does not repeat the checkpoint's evaluation)
            top1, val_loss = evaluate(model, val_loader, dev, ctx, d, cfg["dataset"])
            improved = top1 > best_top1
            best_top1 = max(best_top1, top1)
            # mean of the training losses logged since the previous evaluation
            train_loss = sum(loss_window) / len(loss_window) if loss_window else None
            loss_window = []
            result = {"kind": "eval", "iter": iter_num, "val_top1": top1, "val_loss": val_loss,
                      "train_loss": train_loss, "best_val_top1": best_top1}
            logger.log(result)
            if d.is_master:
                tl = f"{train_loss:.4f}" if train_loss is not None else "-"
                print(f"eval iter {iter_num}: val top-1 {100 * top1:.2f}%, val loss {val_loss:.4f}, train loss {tl}")
            if cfg["always_save_checkpoint"] or improved or iter_num == cfg["max_iters"]:
                save(top1)
        if iter_num >= cfg["max_iters"]:
            break
        lr = trainkit.lr_at(iter_num, lr=cfg["learning_rate"], min_lr=cfg["min_lr"], warmup_iters=cfg["warmup_iters"],
                            decay_iters=decay_iters, schedule=cfg["lr_schedule"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=dev)
        for micro in range(accum):
            images, labels = next(train_iter)
            x, target = prepare_batch(images, labels, cfg, num_classes, micro_step, d.rank, dev)
            micro_step += 1
            last = micro == accum - 1
            with (model.no_sync() if d.ddp and not last else nullcontext()):
                with ctx():
                    logits = model(x)
                loss = soft_cross_entropy(logits, target) / accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.detach()
        trainkit.optimizer_step(optimizer, model.parameters(), cfg["grad_clip"], scaler)
        iter_num += 1
        if iter_num % cfg["log_interval"] == 0 or iter_num == cfg["max_iters"]:
            loss_val = trainkit.all_reduce_mean(loss_sum, d).item()
            if not math.isfinite(loss_val):
                raise FloatingPointError(
                    f"non-finite training loss ({loss_val}) at iteration {iter_num}; the last good checkpoint is "
                    f"in {cfg['out_dir']}. Try a lower learning_rate, grad_clip=1.0 or dtype=float32/bfloat16.")
            loss_window.append(loss_val)
            dt = (time.time() - t0) / cfg["log_interval"]
            t0 = time.time()
            images_per_s = cfg["batch_size"] * accum * d.world_size / max(dt, 1e-9)
            logger.log({"kind": "train", "iter": iter_num, "loss": loss_val, "lr": lr, "ms": 1000 * dt,
                        "img_per_s": images_per_s})
            if d.is_master:
                print(f"iter {iter_num}: loss {loss_val:.4f}, lr {lr:.2e}, {1000 * dt:.0f} ms/iter, "
                      f"{images_per_s:.0f} img/s")
    return result


# -----------------------------------------------------------------------------
# 7. Benchmark: forward time and peak memory, softmax attention vs TSSA


def _bench_module(cfg, attn_kind, side):
    """(module, input) for one measurement: n_layer attention layers on tokens, or the ViT."""
    torch.manual_seed(0)
    T = (side // cfg["patch_size"]) ** 2
    if cfg["bench_scope"] == "attention":
        layers = [make_attention(attn_kind, n_embd=cfg["n_embd"], n_head=cfg["n_head"], bias=True)
                  for _ in range(cfg["n_layer"])]
        return nn.Sequential(*layers), torch.randn(cfg["bench_batch"], T, cfg["n_embd"])
    args = {k: cfg[k] for k in MODEL_KEYS}
    model = ToSTViT(ViTConfig(**{**args, "attn": attn_kind, "img_size": side}, num_classes=1000))
    return model, torch.randn(cfg["bench_batch"], 3, side, side)


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss():
    """Reset the kernel's peak resident set (VmHWM) to the current one; False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _measure(cfg, attn_kind, side, dev):
    """(median forward ms, peak extra memory MiB) of one forward pass under no_grad.
    GPU: torch.cuda peak allocation above what is allocated before the pass. CPU: growth of the
    process's peak resident set during the pass (run in a fresh process per measurement, with
    the peak reset to the current resident set just before, so neither earlier measurements
    nor building the module hide it)."""
    module, x = _bench_module(cfg, attn_kind, side)
    module, x = module.to(dev).eval(), x.to(dev)
    ctx, _ = trainkit.autocast_for(dev, resolve_dtype(cfg["dtype"], dev))
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    with torch.no_grad(), ctx():
        if dev.startswith("cuda"):
            module(x)  # warm-up (kernel selection, allocator)
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            module(x)
            sync()
            peak_mib = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        else:
            _reset_peak_rss()
            base = _rss_kib("VmRSS")
            module(x)
            peak_mib = (_rss_kib("VmHWM") - base) / 1024
        times = []
        for _ in range(cfg["bench_repeats"]):
            sync()
            t = time.perf_counter()
            module(x)
            sync()
            times.append(1000 * (time.perf_counter() - t))
    return float(np.median(times)), peak_mib


def _measure_in_child(cfg, attn_kind, side, dev, queue):
    torch.set_num_threads(cfg["_threads"])
    queue.put(_measure(cfg, attn_kind, side, dev))


def measure(cfg, attn_kind, side, dev):
    if dev.startswith("cuda"):
        return _measure(cfg, attn_kind, side, dev)
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure_in_child, args=({**cfg, "_threads": torch.get_num_threads()},
                                                       attn_kind, side, dev, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def run_benchmark(cfg):
    dev = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg["bench_scope"] not in ("attention", "model"):
        raise trainkit.ConfigError(f"bench_scope must be 'attention' or 'model', got {cfg['bench_scope']!r}")
    name = torch.cuda.get_device_name() if dev.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    what = f"{cfg['n_layer']} attention layers" if cfg["bench_scope"] == "attention" else "whole ViT"
    print(f"forward pass, {what}, width {cfg['n_embd']}, {cfg['n_head']} heads, batch {cfg['bench_batch']}, "
          f"patch {cfg['patch_size']}, {resolve_dtype(cfg['dtype'], dev)}, {name}, torch {torch.__version__}")
    print("| image | tokens | softmax (SDPA) ms | ToST ms | time ratio | softmax MiB | ToST MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    last = {}  # attn -> (tokens, ms) of the last measurement, to predict the next one
    rows = []
    for side in cfg["bench_sizes"]:
        if side % cfg["patch_size"]:
            raise trainkit.ConfigError(f"bench_sizes must be multiples of patch_size ({cfg['patch_size']}): {side}")
        T = (side // cfg["patch_size"]) ** 2
        res = {}
        for kind in ("softmax", "tssa"):
            power = 2 if kind == "softmax" else 1
            if kind in last and last[kind][1] / 1000 * (T / last[kind][0]) ** power > cfg["bench_time_limit"]:
                res[kind] = None  # predicted to exceed the time limit
                continue
            res[kind] = measure(cfg, kind, side, dev)
            last[kind] = (T, res[kind][0])
        fmt = lambda r, i: "skipped" if r is None else f"{r[i]:.1f}"
        ratio = lambda i: (f"{res['softmax'][i] / max(res['tssa'][i], 1e-9):.1f}x"
                           if res["softmax"] and res["tssa"] else "-")
        print(f"| {side}x{side} | {T} | {fmt(res['softmax'], 0)} | {fmt(res['tssa'], 0)} | {ratio(0)} | "
              f"{fmt(res['softmax'], 1)} | {fmt(res['tssa'], 1)} | {ratio(1)} |", flush=True)
        rows.append({"side": side, "tokens": T, **res})
    return rows


# -----------------------------------------------------------------------------


def main(argv=None):
    cfg = trainkit.configure(DEFAULTS, sys.argv[1:] if argv is None else argv)
    if cfg["num_threads"] > 0:
        torch.set_num_threads(cfg["num_threads"])
    if cfg["bench"]:
        return run_benchmark(cfg)
    return train(cfg)


if __name__ == "__main__":
    trainkit.run_cli(main)
