"""
Train or fine-tune ToST-ViT (the Token Statistics Transformer for images), or the softmax
baseline of the same size (--attn=softmax), for image classification. Read top to bottom: the
settings, the data, the recipes, the model, then main() (DDP, the checkpoint, the loop).

    python vit_train.py config/vit_cpu.py                  # CPU, built-in "shapes" data, minutes
    torchrun --standalone --nproc_per_node=8 vit_train.py config/vit_tost_s.py   # ImageNet-1k
    python vit_train.py config/vit_finetune.py --finetune_from=out-vit-tost-s/ckpt.pt --dataset=cifar10

Settings are the module globals below, overridden by config files (positional arguments) and
then --key=value; conventions and policies shared with train.py: see trainkit.py.

Data (`dataset`): "shapes" (built in: ten shapes drawn with torch at random size, rotation,
position and colours on textured backgrounds, chance 1/10, learnable on a CPU);
"cifar10", "cifar100", "imagenet-1k" through Hugging Face `datasets`; "folder": data_dir/train/
<class>/* and data_dir/val/<class>/* (or one tree of class folders, the last val_fraction of each
class held out). Every file of a class folder (hidden files aside) must be an image Pillow
reads: each is opened once at the start, and anything else is named, before any work.

Recipes (`recipe`): "builtin" needs nothing more (random resized crop, horizontal flip, mixup /
cutmix, label smoothing; every draw is a function of (seed, epoch, position), whatever the number
of processes); "paper" is the paper's ImageNet recipe through timm (RandAugment, random erasing,
repeated augmentation, bicubic resizing: the settings marked recipe="paper"; pip install timm, README).

init_from: "scratch", "resume" (out_dir/ckpt.pt, exactly), "auto" (either) or "finetune" (the
body of finetune_from's model, a new head when the classes differ; its architecture, this run's
img_size, dropout and drop_path). out_dir/ckpt.pt is written atomically at every evaluation
(always_save_checkpoint) and log.jsonl gets one JSON line per evaluation.
"""

import math
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import trainkit as tk
from model import ToSTViT, ViTConfig
import kernels

# -----------------------------------------------------------------------------
# settings
out_dir = "out-vit"
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt), "resume", "auto" (either), "finetune"
finetune_from = ""  # init_from="finetune": a ckpt.pt written by vit_train.py
eval_interval = 500  # iterations between evaluations (and checkpoints)
log_interval = 20  # iterations between progress lines
eval_max_images = 0  # 0: the whole validation split
always_save_checkpoint = True  # False: save only when val accuracy improves
# data
dataset = "shapes"  # "shapes" | "cifar10" | "cifar100" | "imagenet-1k" | "folder"
data_dir = ""  # dataset="folder": the image tree
val_fraction = 0.1  # dataset="folder" without train/ and val/: share of each class held out
img_size = 32
num_workers = 0
shapes_train_size = 20000
shapes_val_size = 2000
shapes_num_classes = 10  # 2..10
shapes_source_size = 32
shapes_seed = 0
# recipe
recipe = "builtin"  # "builtin" (no extra package) | "paper" (timm; MATH.md §6.3)
crop_scale = (0.08, 1.0)  # random resized crop: range of the crop's area
hflip = True
mixup = 0.8  # alpha; 0 = off
cutmix = 1.0  # alpha; 0 = off
mix_prob = 1.0
label_smoothing = 0.1
eval_crop_pct = 0.875  # evaluation: resize the short side to img_size / eval_crop_pct, centre crop
randaugment = "rand-m9-mstd0.5-inc1"  # recipe="paper": timm's RandAugment policy
random_erasing = 0.25  # recipe="paper"
repeated_aug = 3  # recipe="paper": each image seen this many times per epoch (1 = off)
# model (resume and finetune take the checkpoint's architecture)
n_layer = 6
n_head = 4
n_embd = 192
patch_size = 4
mlp_ratio = 4.0
dropout = 0.0
drop_path = 0.0  # stochastic depth, the same rate in every ToST block
layer_scale_init = 1.0  # 0: no layer scale
attn = "tssa"  # "tssa" | "softmax" | "linear" (baselines at the same size)
pi = "softmax"  # "softmax" | "uniform" (ablation)
n_cls_layers = 2
tssa_impl = "torch"
# AdamW, learning-rate schedule (trainkit's get_lr: warmup, then decay to min_lr at lr_decay_iters)
batch_size = 128  # images per process per micro-step
gradient_accumulation_steps = 1  # micro-steps per optimizer step over all processes
max_iters = 5000
learning_rate = 1e-3
min_lr = 1e-5
warmup_iters = 250
lr_decay_iters = 0  # 0: max_iters
lr_schedule = "cosine"  # "cosine", "linear" or "constant"
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.999
grad_clip = 1.0  # 0: off
# system
device = "auto"  # "auto" (this rank's GPU if there is one, else cpu), "cpu", "cuda", "cuda:1"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False
num_threads = 0  # CPU threads for torch (0: torch's default)
sync_bn = True  # under DDP on GPUs: SyncBatchNorm in the patch embedding
seed = 1337
# -----------------------------------------------------------------------------
DEFAULTS = tk.config_defaults(globals())  # the settings above (nothing defined below is one)
HF_DATASETS = {  # name -> (hub id, image column, label column, train split, val split)
    "cifar10": ("uoft-cs/cifar10", "img", "label", "train", "test"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label", "train", "test"),
    "imagenet-1k": ("ILSVRC/imagenet-1k", "image", "label", "train", "validation"),
}
MEAN_STD = {"shapes": ((0.5,) * 3, (0.5,) * 3), "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
MODEL_KEYS = ("img_size", "patch_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "dropout", "drop_path",
              "layer_scale_init", "attn", "pi", "n_cls_layers")
FINETUNE_OWN = ("img_size", "dropout", "drop_path")  # what a fine-tuning run sets itself


def check_settings(C):
    """Every setting that can be wrong on its own, checked before anything is read or built."""
    tk.check(C, at_least_1=("eval_interval", "log_interval", "img_size", "shapes_train_size", "shapes_val_size",
                            "shapes_source_size", "repeated_aug", "n_layer", "n_head", "n_embd", "patch_size",
                            "n_cls_layers", "batch_size", "gradient_accumulation_steps"),
             non_negative=("eval_max_images", "num_workers", "shapes_seed", "mixup", "cutmix", "layer_scale_init",
                           "max_iters", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip",
                           "num_threads", "seed"),
             positive=("mlp_ratio", "learning_rate"),
             fraction=("val_fraction", "label_smoothing", "dropout", "drop_path", "beta1", "beta2"),
             choices={"init_from": ("scratch", "resume", "auto", "finetune"),
                      "dataset": ("shapes", "folder", *HF_DATASETS), "recipe": ("builtin", "paper"),
                      "attn": ("tssa", "softmax", "linear"), "pi": ("softmax", "uniform"), "tssa_impl": kernels.IMPLS,
                      "lr_schedule": ("cosine", "linear", "constant")})
    for key in ("mix_prob", "random_erasing"):
        tk.require(0 <= getattr(C, key) <= 1, f"{key} must be in [0, 1], got {getattr(C, key)}")
    tk.require(0 < C.eval_crop_pct <= 1, f"eval_crop_pct must be in (0, 1], got {C.eval_crop_pct}")
    low_high = C.crop_scale
    tk.require(len(low_high) == 2 and all(type(v) in (int, float) for v in low_high) and 0 < low_high[0] <= low_high[1] <= 1,
               f"crop_scale must be two numbers (low, high) with 0 < low <= high <= 1, got {low_high!r}")
    tk.require(2 <= C.shapes_num_classes <= len(SHAPES), f"shapes_num_classes must be in 2..{len(SHAPES)}, "
                                                         f"got {C.shapes_num_classes}")
    tk.require(C.patch_size >= 2 and C.patch_size & (C.patch_size - 1) == 0,
               f"patch_size must be a power of two >= 2 (stride-2 convolutions), got {C.patch_size}")
    tk.require(C.img_size % C.patch_size == 0, f"img_size ({C.img_size}) must be divisible by patch_size ({C.patch_size})")
    tk.require(C.n_embd % C.n_head == 0, f"n_embd ({C.n_embd}) must be divisible by n_head ({C.n_head})")
    tk.require(C.n_embd >= C.patch_size // 2, f"n_embd ({C.n_embd}) must be at least patch_size / 2 "
                                              f"({C.patch_size // 2}): the patch embedding halves it per convolution")
    tk.require(C.min_lr <= C.learning_rate, f"min_lr ({C.min_lr}) must not exceed learning_rate ({C.learning_rate})")
    tk.require(C.out_dir, "out_dir must not be empty")
    tk.require(C.dataset != "folder" or C.data_dir, "dataset='folder' needs --data_dir=<a folder of class folders>")
    tk.require(C.init_from != "finetune" or C.finetune_from,
               "init_from='finetune' needs --finetune_from=<a ckpt.pt written by vit_train.py>")


def mean_std(name):
    return MEAN_STD[name if name == "shapes" else "cifar" if name.startswith("cifar") else "imagenet"]


# -----------------------------------------------------------------------------
# 1. Data: the built-in shapes, image folders, Hugging Face datasets (uint8 (3, H, W) images)

SHAPES = ("disk", "ring", "triangle", "plus", "pair", "star", "square", "frame", "ellipse", "crescent")


def _shape_mask(kind, u, v):
    """Inside-mask of a shape of radius 1 in its own rotated frame; u, v: (n, S, S)."""
    r, box = torch.sqrt(u * u + v * v), torch.maximum(u.abs(), v.abs())
    masks = {
        "disk": lambda: r <= 1, "ring": lambda: (r <= 1) & (r >= 0.55), "square": lambda: box <= 0.8,
        "frame": lambda: (box <= 0.85) & (box >= 0.5),
        "triangle": lambda: (v >= -0.5) & (0.866 * u + 0.5 * v <= 0.5) & (-0.866 * u + 0.5 * v <= 0.5),
        "plus": lambda: ((u.abs() <= 0.3) & (v.abs() <= 1)) | ((v.abs() <= 0.3) & (u.abs() <= 1)),
        "star": lambda: r <= 0.55 + 0.4 * torch.cos(5 * torch.atan2(v, u)),
        "ellipse": lambda: u * u + (v / 0.45) ** 2 <= 1,
        "pair": lambda: ((u - 0.55) ** 2 + v * v <= 0.16) | ((u + 0.55) ** 2 + v * v <= 0.16),
        "crescent": lambda: (r <= 1) & ((u - 0.45) ** 2 + v * v >= 0.5625)}
    return masks[kind]()


def make_shapes(n, size=32, num_classes=10, seed=0):
    """n images (uint8 (n, 3, size, size)) and labels ((n,) int64): one shape per image at a
    random position, radius, rotation and colour, on a two-colour gradient with noise.
    Same arguments -> same tensors, on any machine."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.rand(*shape, generator=g)
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)
    coords = (torch.arange(2 * size, dtype=torch.float32) + 0.5) / 2  # drawn at 2x, then averaged 2x2
    for start in range(0, n, 1000):  # in chunks of 1000 images
        lab = labels[start:start + 1000]
        m = lab.numel()
        radius = size * (0.22 + 0.16 * rand(m))
        cx, cy = (radius + 1 + (size - 2 * radius - 2) * rand(m) for _ in range(2))
        angle = 2 * math.pi * rand(m)
        dx = (coords[None, None, :] - cx[:, None, None]) / radius[:, None, None]  # (m, 1, 2S)
        dy = (coords[None, :, None] - cy[:, None, None]) / radius[:, None, None]  # (m, 2S, 1)
        cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
        u, v = cos * dx + sin * dy, -sin * dx + cos * dy  # (m, 2S, 2S)
        mask = torch.zeros(m, 2 * size, 2 * size)
        for k in range(num_classes):
            sel = lab == k
            if sel.any():
                mask[sel] = _shape_mask(SHAPES[k], u[sel], v[sel]).float()
        mask = F.avg_pool2d(mask[:, None], 2)  # (m, 1, S, S) in [0, 1]
        c0, c1, theta = rand(m, 3, 1, 1), rand(m, 3, 1, 1), 2 * math.pi * rand(m, 1, 1, 1)
        ramp = torch.linspace(0, 1, size)
        t = (theta.cos() * ramp[None, None, None, :] + theta.sin() * ramp[None, None, :, None] + 1) / 3
        bg = c0 + (c1 - c0) * t + 0.05 * torch.randn(m, 3, size, size, generator=g)  # (m, 3, S, S)
        fg = rand(m, 3, 1, 1)  # a colour that stands out from the background's mean brightness
        low_contrast = (fg.mean(1) - bg.mean((1, 2, 3))[:, None, None]).abs() < 0.25  # (m, 1, 1)
        fg = torch.where(low_contrast[:, None], 1 - bg.mean((2, 3), keepdim=True), fg)
        fg = fg + 0.05 * torch.randn(m, 3, size, size, generator=g)
        img = mask * fg + (1 - mask) * bg
        images[start:start + m] = (img.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


def rgb_tensor(im):
    """A Pillow image -> uint8 (3, H, W), RGB."""
    return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1).contiguous()


def load_image(path):
    """An image file -> uint8 (3, H, W); a file Pillow cannot decode is a UserError naming it."""
    try:
        with Image.open(path) as im:
            return rgb_tensor(im)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise tk.UserError(f"cannot decode {path} as an image ({type(e).__name__}: {' '.join(str(e).split())}): "
                           "remove or replace it") from None


def check_image(path):
    """Open `path` with Pillow and check what it can without decoding; anything else is named."""
    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # UnidentifiedImageError, truncated or damaged data, decompression bombs, ...
        why = "not an image format Pillow knows" if isinstance(e, Image.UnidentifiedImageError) else \
            f"{type(e).__name__}: {' '.join(str(e).split())}"
        raise tk.UserError(f"{path} is not a readable image ({why}): remove it (class folders hold only images)") from None


class Source:
    """Images with labels: held in memory (uint8 (N, 3, H, W)), or files or Hub rows that
    read(item) decodes."""

    def __init__(self, items, labels, classes, read=None):
        self.items, self.labels, self.classes, self.read = items, list(map(int, labels)), list(classes), read

    def __len__(self):
        return len(self.labels)

    def get(self, i):  # -> (uint8 (3, H, W), label)
        item = self.items[int(i)]
        return (self.read(item) if self.read else item), self.labels[i]


def scan_image_folder(root):
    """root/<class>/<files> -> {class: [paths]}, classes sorted by name, every file checked to
    be an image (hidden files skipped). No class folder, or an empty one, is refused."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    files = {}
    for name in classes:
        files[name] = [os.path.join(folder, f) for folder, subs, names in sorted(os.walk(os.path.join(root, name)))
                       for f in sorted(names) if not f.startswith(".")]
        if not files[name]:
            raise tk.UserError(f"class folder {os.path.join(root, name)} holds no images: add some, or remove it")
    if not classes:
        raise tk.UserError(f"{root} holds no class folders: expected {root}/<class>/<images>, one folder per class")
    with ThreadPoolExecutor(16) as pool:  # file system latency, not compute: threads overlap it
        list(pool.map(check_image, [p for name in classes for p in files[name]]))
    return files


def folder_sources(data_dir, val_fraction):
    """data_dir/train + data_dir/val (or validation/test), or one tree (data_dir, or data_dir/train
    alone) whose last val_fraction of each class (in name order) is held out."""
    if not os.path.isdir(data_dir):
        what = "is a file" if os.path.exists(data_dir) else "does not exist"
        raise tk.UserError(f"data_dir={data_dir!r} {what}: give --data_dir=<folder> holding train/<class>/<images> "
                           "and val/<class>/<images>, or <class>/<images>")
    train_dir = os.path.join(data_dir, "train") if os.path.isdir(os.path.join(data_dir, "train")) else data_dir
    val_dir = next((os.path.join(data_dir, d) for d in ("val", "validation", "test")
                    if os.path.isdir(os.path.join(data_dir, d))), None)
    tk.require(train_dir != data_dir or val_dir is None,
               f"{val_dir} has no train/ beside it: give {data_dir}/train/<class>/<images> too")
    files = scan_image_folder(train_dir)
    classes = list(files)
    if len(classes) < 2:
        raise tk.UserError(f"{train_dir} holds one class folder ({classes[0]}); classification needs at least 2: "
                           f"{train_dir}/<class>/<images>, one folder per class")
    if val_dir is not None:
        val_files = scan_image_folder(val_dir)
        extra = sorted(set(val_files) - set(classes))
        if extra:
            raise tk.UserError(f"{val_dir} has classes that {train_dir} lacks: {', '.join(extra[:5])}: "
                               "give every val class a train folder")
    else:
        val_files = {}
        for name, paths in files.items():
            n_val = int(round(val_fraction * len(paths)))
            if not 0 < n_val < len(paths):
                raise tk.UserError(f"class {name!r} has {len(paths)} image(s): val_fraction={val_fraction} leaves "
                                   f"{len(paths) - n_val} to train and {n_val} to validate, and each needs at least 1: "
                                   f"add images, change --val_fraction, or give {data_dir}/train and {data_dir}/val")
            files[name], val_files[name] = paths[:-n_val], paths[-n_val:]
    label = {name: k for k, name in enumerate(classes)}
    return tuple(Source([p for name in split for p in split[name]], [label[name] for name in split for _ in split[name]],
                        classes, load_image) for split in (files, val_files))


def build_sources(C):
    """(train source, val source) for C.dataset."""
    if C.dataset == "shapes":
        n, s = C.shapes_num_classes, 2 * C.shapes_seed
        return tuple(Source(*make_shapes(size, C.shapes_source_size, n, seed=s + i), SHAPES[:n])
                     for i, size in enumerate((C.shapes_train_size, C.shapes_val_size)))
    if C.dataset == "folder":
        return folder_sources(C.data_dir, C.val_fraction)
    import datasets  # CIFAR-10/100 (decoded into memory once) or ImageNet-1k (decoded on demand)
    hub_id, image_key, label_key, train_split, val_split = HF_DATASETS[C.dataset]
    try:
        splits = [datasets.load_dataset(hub_id, split=s) for s in (train_split, val_split)]
    except Exception as e:  # no network, offline mode, gated repository, ...
        raise tk.UserError(
            f"could not load {hub_id!r} through Hugging Face datasets ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
            "it needs the network the first time (imagenet-1k: accept its terms, `huggingface-cli login`). "
            "Without it: --dataset=folder --data_dir=<image tree>, or --dataset=shapes") from None
    classes = splits[0].features[label_key].names
    if C.dataset == "imagenet-1k":
        return tuple(Source(ds, ds[label_key], classes, lambda row: rgb_tensor(row[image_key])) for ds in splits)
    return tuple(Source(torch.stack([rgb_tensor(im) for im in ds[image_key]]), ds[label_key], classes)
                 for ds in splits)


# -----------------------------------------------------------------------------
# 2. Recipes: the built-in one (crop, flip, mixup / cutmix) and the paper's through timm


def resize(img, size):
    """uint8 (3, H, W) -> uint8 (3, *size), bilinear with antialiasing."""
    if tuple(img.shape[1:]) == tuple(size):
        return img
    out = F.interpolate(img[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    return out[0].round().clamp(0, 255).to(torch.uint8)


def random_resized_crop_box(H, W, scale, rng):
    """(top, left, h, w): area in scale * H * W, aspect ratio log-uniform in [3/4, 4/3]; after
    10 failed tries the whole image."""
    for _ in range(10):
        area = H * W * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if 0 < w <= W and 0 < h <= H:
            return int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1)), h, w
    return 0, 0, H, W


def center_crop(img, size, crop_pct):
    """Resize the short side to size / crop_pct, then take the centre size x size."""
    H, W = img.shape[1:]
    scale = int(round(size / crop_pct)) / min(H, W)
    img = resize(img, (max(size, int(round(H * scale))), max(size, int(round(W * scale)))))
    top, left = (img.shape[1] - size) // 2, (img.shape[2] - size) // 2
    return img[:, top:top + size, left:left + size]


class View(torch.utils.data.Dataset):
    """A source seen through a recipe at img_size. Training keys are (epoch, slot, index): a
    crop depends only on (seed, epoch, slot), never on worker count or order. Built in: uint8
    crops (normalised on the device); "paper": timm's transform under a per-key seed."""

    def __init__(self, source, C, train, timm_transform=None):
        self.source, self.C, self.train, self.transform = source, C, train, timm_transform

    def __len__(self):
        return len(self.source)

    def __getitem__(self, key):
        epoch, slot, index = key if self.train else (0, key, key)
        img, label = self.source.get(index)
        seed = [self.C.seed, epoch, slot]
        if self.transform is not None:
            return self._timm(img, seed), label
        size = self.C.img_size
        if not self.train:
            return center_crop(img, size, self.C.eval_crop_pct), label
        rng = np.random.default_rng(seed)
        top, left, h, w = random_resized_crop_box(img.shape[1], img.shape[2], self.C.crop_scale, rng)
        img = resize(img[:, top:top + h, left:left + w], (size, size))
        return (img.flip(-1) if self.C.hflip and rng.random() < 0.5 else img), label

    def _timm(self, img, seed):
        """timm draws from python's, numpy's and torch's global generators: seed them from the
        key, run the transform, put them back."""
        state = random.getstate(), np.random.get_state(), torch.get_rng_state()
        s = int(np.random.SeedSequence(seed).generate_state(1)[0])
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)
        try:
            return self.transform(Image.fromarray(img.permute(1, 2, 0).numpy()))
        finally:  # not tk.restore_rng: that touches CUDA, which a forked worker must not
            random.setstate(state[0])
            np.random.set_state(state[1])
            torch.set_rng_state(state[2])


def timm_transforms(C):
    """(train, eval) transforms of the paper's recipe, built by timm."""
    try:
        from timm.data import create_transform
    except ImportError as e:
        raise tk.UserError(f"recipe='paper' needs timm ({e}): pip install timm (the README says how next to a "
                           "CPU torch), or --recipe=builtin") from None
    from timm.data.auto_augment import posterize
    try:  # RandAugment at magnitude 10 (rand-m9-mstd0.5 reaches it) keeps 0 bits: Pillow 13 refuses that
        posterize(Image.new("RGB", (1, 1)), 0)
    except ValueError as e:
        raise tk.UserError(f"timm's RandAugment posterizes to 0 bits, which this Pillow refuses ({e}): "
                           "install Pillow<13 next to timm (README)") from None
    mean, std = mean_std(C.dataset)
    common = dict(input_size=C.img_size, interpolation="bicubic", mean=mean, std=std)
    train = create_transform(**common, is_training=True, scale=tuple(C.crop_scale),
                             hflip=0.5 if C.hflip else 0.0, auto_augment=C.randaugment or None,
                             re_prob=C.random_erasing, re_mode="pixel", re_count=1)
    return train, create_transform(**common, is_training=False, crop_pct=C.eval_crop_pct)


class TrainBatches:
    """This process's micro-batches of keys (epoch, slot, index), from its local micro-step
    `start` on. Built in: each epoch one permutation (seed + epoch) cut into global micro-
    batches; rank r takes global micro-batch m * world_size + r at its m-th micro-step, so
    the data of a step does not depend on world_size. Paper: timm's RepeatAugSampler."""

    def __init__(self, n, batch_size, rank, world_size, seed, start=0, repeats=1):
        self.n, self.bs, self.rank, self.world, self.seed, self.start = n, batch_size, rank, world_size, seed, start
        self.sampler = None
        if repeats > 1:
            from timm.data.distributed_sampler import RepeatAugSampler
            self.sampler = RepeatAugSampler(range(n), num_replicas=world_size, rank=rank, num_repeats=repeats,
                                            selected_round=256 if n >= 256 * world_size else 0)
        per_epoch = len(self.sampler) if self.sampler else n // world_size
        self.steps_per_epoch = per_epoch // batch_size
        if self.steps_per_epoch == 0:
            raise tk.UserError(f"the training set ({n} images over {world_size} process(es)) is smaller than "
                               f"one batch ({batch_size}): lower --batch_size")

    def epoch_keys(self, epoch):  # -> [(slot, index)] of this rank, in order
        if self.sampler is not None:
            self.sampler.set_epoch(self.seed + epoch)
            return [(j * self.world + self.rank, i) for j, i in enumerate(self.sampler)]
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
        keys = []
        for m in range(self.steps_per_epoch):
            first = (m * self.world + self.rank) * self.bs  # the first slot of global micro-batch m * world + rank
            keys += [(slot, perm[slot]) for slot in range(first, first + self.bs)]
        return keys

    def __iter__(self):
        epoch, b = divmod(self.start, self.steps_per_epoch)
        while True:
            keys = self.epoch_keys(epoch)
            for b in range(b, self.steps_per_epoch):
                yield [(epoch, slot, i) for slot, i in keys[b * self.bs:(b + 1) * self.bs]]
            epoch, b = epoch + 1, 0


def mix_batch(x, target, rng, mixup_alpha, cutmix_alpha, prob):
    """Built-in mixup or cutmix of the batch with its reverse: x (B, 3, H, W), target (B, K)
    soft labels, rng a numpy Generator -> (x, target, lam), lam the share of each image's own
    content (1.0 when left alone)."""
    if (mixup_alpha <= 0 and cutmix_alpha <= 0) or rng.random() >= prob:
        return x, target, 1.0
    use_cutmix = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < 0.5)
    lam = float(rng.beta(*[cutmix_alpha if use_cutmix else mixup_alpha] * 2))
    other = x.flip(0)
    if use_cutmix:  # paste a box of area ~ (1 - lam) from the partner image
        H, W = x.shape[2:]
        ch, cw, cy, cx = int(H * math.sqrt(1 - lam)), int(W * math.sqrt(1 - lam)), rng.integers(H), rng.integers(W)
        y0, y1, x0, x1 = max(cy - ch // 2, 0), min(cy + ch // 2, H), max(cx - cw // 2, 0), min(cx + cw // 2, W)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = other[:, :, y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (H * W)  # the area actually pasted
    else:
        x = lam * x + (1 - lam) * other
    return x, lam * target + (1 - lam) * target.flip(0), lam


def smooth_targets(labels, num_classes, smoothing):
    return F.one_hot(labels, num_classes).float() * (1 - smoothing) + smoothing / num_classes


def to_input(images, dataset_name, dev):
    """A loader batch on the device, normalised: built-in views give uint8, timm's floats."""
    x = images.to(dev, non_blocking=True)
    if x.dtype != torch.uint8:
        return x
    mean, std = (torch.tensor(v, device=dev).view(1, 3, 1, 1) for v in mean_std(dataset_name))
    return (x.float() / 255 - mean) / std


# -----------------------------------------------------------------------------
# 3. Model, evaluation, the training loop


def model_from_checkpoint(ckpt, **overrides):
    """Rebuild the model a checkpoint of this script holds (on the CPU)."""
    model = ToSTViT(ViTConfig(**{**ckpt["model_args"], **overrides}))
    model.load_state_dict(ckpt["model"])
    return model


@torch.no_grad()
def evaluate(model, loader, device, ctx, d, dataset_name):
    """(accuracy, cross-entropy) over the loader, summed over all processes."""
    model.eval()
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # correct, loss sum, count
    for images, labels in loader:
        labels = labels.to(device)
        with ctx:
            logits = model(to_input(images, dataset_name, device))
        sums += torch.stack([(logits.argmax(-1) == labels).sum().double(),
                             F.cross_entropy(logits.float(), labels, reduction="sum").double(),
                             torch.tensor(labels.numel(), device=device, dtype=torch.float64)])
    if d.ddp:
        torch.distributed.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def main(argv):
    # -------------------------------------------------------------------------
    # settings: the globals above, then config files and --key=value, then checks; the data,
    # read and checked before anything is written
    C, given = tk.configure(DEFAULTS, argv)
    check_settings(C)
    device, dtype = tk.choose_device_dtype(C.device, C.dtype)
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    if C.init_from == "auto":  # continue the run in out_dir if there is one, else start one
        C.init_from = "resume" if os.path.isfile(ckpt_path) else "scratch"
    if C.init_from != "resume" and os.path.exists(ckpt_path):  # (claim_out_dir checks again, under the lock)
        raise tk.UserError(f"{ckpt_path} already exists and init_from={C.init_from!r} would overwrite it: continue "
                           "that run with --init_from=resume, or write this one elsewhere with --out_dir=<new folder>")
    if C.init_from == "finetune" and not os.path.exists(C.finetune_from):
        raise tk.UserError(f"finetune_from={C.finetune_from!r} does not exist: give the ckpt.pt of a vit_train.py run")
    train_src, val_src = build_sources(C)
    num_classes = len(train_src.classes)

    # -------------------------------------------------------------------------
    # DDP from torchrun's environment (one process without torchrun)
    with tk.distributed(device) as d:
        device = d.device
        say = print if d.is_master else (lambda *a, **k: None)
        tk.require(C.gradient_accumulation_steps % d.world_size == 0,
                   f"gradient_accumulation_steps ({C.gradient_accumulation_steps}) must be divisible by the "
                   f"number of processes ({d.world_size})")
        accum = C.gradient_accumulation_steps // d.world_size  # micro-steps of this process per optimizer step
        torch.manual_seed(C.seed + d.rank)  # dropout, drop path; the weights come from rank 0 (DDP)
        np.random.seed(C.seed + d.rank)  # timm's Mixup draws from numpy's and python's generators
        random.seed(C.seed + d.rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the checkpoint: resume (its architecture and seed win) or finetune (its architecture)
        ckpt, iter_num, best_acc, best_loss = None, 0, 0.0, float("inf")
        if C.init_from == "resume":
            ckpt = tk.load_checkpoint(ckpt_path, "vit")
            tk.check_resume(ckpt, C, given, MODEL_KEYS + ("dataset", "seed"), ckpt_path)
            if ckpt["classes"] != train_src.classes:
                raise tk.UserError(f"{ckpt_path} classifies {len(ckpt['classes'])} classes, dataset {C.dataset!r} has "
                                   f"other classes ({num_classes}): resume it on its own data, or start from it with "
                                   f"--init_from=finetune --finetune_from={ckpt_path} --out_dir=<new folder>")
            for key in MODEL_KEYS + ("seed",):  # what the checkpoint was, this run is
                setattr(C, key, ckpt["config"][key])
            iter_num, best_acc, best_loss = ckpt["iter_num"], ckpt["best_val_acc"], ckpt["best_val_loss"]
            if iter_num >= C.max_iters:
                say(f"{ckpt_path} already reached max_iters={C.max_iters} (iter {iter_num}): nothing to do; raise "
                    f"--max_iters to train it further, or look inside it: python vit_inspect.py --ckpt={ckpt_path}")
                return None
        elif C.init_from == "finetune":
            ckpt = tk.load_checkpoint(C.finetune_from, "vit")
            body = [k for k in MODEL_KEYS if k not in FINETUNE_OWN]
            differ = [k for k in body if k in given and getattr(C, k) != ckpt["config"][k]]
            if differ:
                raise tk.UserError(f"fine-tuning keeps the architecture of {C.finetune_from}: drop "
                                   + ", ".join(f"--{k}={getattr(C, k)!r} (checkpoint: {ckpt['config'][k]!r})" for k in differ))
            for key in body:
                setattr(C, key, ckpt["config"][key])

        # ---------------------------------------------------------------------
        # the data loaders: this process's training batches from its current micro-step on
        transforms = timm_transforms(C) if C.recipe == "paper" else (None, None)
        batches = TrainBatches(len(train_src), C.batch_size, d.rank, d.world_size, C.seed, iter_num * accum,
                               C.repeated_aug if C.recipe == "paper" else 1)
        n_val = len(val_src) if C.eval_max_images == 0 else min(len(val_src), C.eval_max_images)
        mine = list(range(d.rank, n_val, d.world_size))
        val_batches = [mine[i:i + C.batch_size] for i in range(0, len(mine), C.batch_size)]
        loader = lambda view, batches, pin: torch.utils.data.DataLoader(  # noqa: E731 (own generator, not the global one)
            view, batch_sampler=batches, num_workers=C.num_workers, pin_memory=pin,
            generator=torch.Generator().manual_seed(0))
        train_loader = loader(View(train_src, C, True, transforms[0]), batches, device.startswith("cuda"))
        val_loader = loader(View(val_src, C, False, transforms[1]), val_batches, False)
        if d.is_master:
            tk.claim_out_dir(C.out_dir, C.init_from)  # a lock; a scratch run never overwrites a checkpoint

        # ---------------------------------------------------------------------
        # the model: fresh, or the checkpoint's weights (finetune: a new head for other classes)
        model_args = {k: getattr(C, k) for k in MODEL_KEYS}
        model_args["layer_scale_init"] = C.layer_scale_init or None  # 0: none
        model = ToSTViT(ViTConfig(**model_args,
                                  num_classes=ckpt["model_args"]["num_classes"] if ckpt else num_classes))
        kernels.use(model, C.tssa_impl)
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            if model.config.num_classes != num_classes:
                model.reset_classifier(num_classes)
        model.to(device)
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2), device_type)
        ctx = torch.autocast(device_type, dtype=tk.DTYPES[dtype], enabled=dtype != "float32")
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        resumed_at = None
        if C.init_from == "resume":
            optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("scaler"):
                scaler.load_state_dict(ckpt["scaler"])
            tk.restore_rng(ckpt["rng"], d, say)
            resumed_at = iter_num  # saved right after evaluating at this iteration
            say(f"resumed from {ckpt_path} at iter {iter_num}")
            tk.on_interrupt(f"{ckpt_path} holds iter {iter_num}; continue with the same command and --init_from=resume")
        ckpt = None  # free the memory
        raw_model = model  # the plain module: parameters, checkpoints
        if d.ddp and C.sync_bn and device_type == "cuda":
            model = raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if C.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model)
        if d.ddp:
            model = nn.parallel.DistributedDataParallel(model, device_ids=[d.local_rank] if device_type == "cuda" else None)
        logger = tk.JsonlLogger(os.path.join(C.out_dir, "log.jsonl"), d.is_master, fresh=C.init_from != "resume")
        say(f"{C.attn} ViT: {raw_model.get_num_params() / 1e6:.2f}M parameters, {num_classes} classes, "
            f"{len(train_src)} train / {len(val_src)} val images, {d.world_size} process(es) on {device}, {dtype}, "
            f"recipe {C.recipe}, {C.gradient_accumulation_steps * C.batch_size} images per iteration")
        timm_mixup = None
        if C.recipe == "paper" and (C.mixup > 0 or C.cutmix > 0):
            from timm.data import Mixup  # its draws come from numpy's global generator (checkpointed)
            timm_mixup = Mixup(mixup_alpha=C.mixup, cutmix_alpha=C.cutmix, prob=C.mix_prob,
                               label_smoothing=C.label_smoothing, num_classes=num_classes)

        def mix(x, labels, step):  # -> (inputs, soft targets (B, K)) of the recipe; step: the global micro-batch
            if timm_mixup is not None:
                return timm_mixup(x, labels)
            target = smooth_targets(labels, num_classes, C.label_smoothing)
            return mix_batch(x, target, np.random.default_rng([C.seed, step]), C.mixup, C.cutmix, C.mix_prob)[:2]

        # ---------------------------------------------------------------------
        # the training loop
        train_iter, record = iter(train_loader), None
        t_start = t_log = time.time()
        loss_sum, loss_steps = 0.0, 0  # training losses since the last evaluation
        while True:
            lr = tk.get_lr(iter_num, C)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (iter_num % C.eval_interval == 0 or iter_num == C.max_iters) and iter_num != resumed_at:
                acc, val_loss = evaluate(model, val_loader, device, ctx, d, C.dataset)
                improved = acc > best_acc
                best_acc, best_loss = max(best_acc, acc), min(best_loss, val_loss)
                record = dict(iter=iter_num, lr=lr, train_loss=loss_sum / loss_steps if loss_steps else None,
                              val_loss=val_loss, val_acc=acc, time_s=round(time.time() - t_start, 3))
                loss_sum, loss_steps = 0.0, 0
                logger.log(record)
                train_text = "-" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
                say(f"eval iter {iter_num}: val acc {100 * acc:.2f}%, val loss {val_loss:.4f}, train loss {train_text}")
                if not math.isfinite(val_loss):  # the last update broke the weights: do not save them
                    raise tk.non_finite(f"validation loss ({val_loss}) at iter {iter_num}, not saved", ckpt_path, C, dtype)
                if C.always_save_checkpoint or improved or iter_num == C.max_iters:
                    rng = tk.gather_rng_states(d)  # a collective: every rank takes part
                    if d.is_master:
                        tk.save_checkpoint(dict(
                            kind="vit", model=raw_model.state_dict(),
                            optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                            model_args={**model_args, "num_classes": num_classes}, iter_num=iter_num,
                            best_val_loss=best_loss, best_val_acc=best_acc, config=vars(C), rng=rng,
                            classes=train_src.classes), ckpt_path)
                        say(f"saved {ckpt_path}")
                    tk.on_interrupt(f"{ckpt_path} holds iter {iter_num}; continue with the same command "
                                    "and --init_from=resume")
            if iter_num >= C.max_iters:
                break

            # one optimizer step: `accum` micro-batches per process, the gradients averaged over
            # the processes at the last one only (no_sync before it)
            step_loss = torch.zeros((), device=device)
            for micro in range(accum):
                images, labels = next(train_iter)
                step = (iter_num * accum + micro) * d.world_size + d.rank  # the global micro-batch number
                x, target = mix(to_input(images, C.dataset, device), labels.to(device), step)  # (B, 3, S, S), (B, K)
                with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                    with ctx:
                        logits = model(x)  # (B, K)
                    loss = -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean() / accum
                    scaler.scale(loss).backward()
                step_loss += loss.detach()
            train_loss = tk.all_reduce_mean(step_loss, d).item()  # over every micro-batch of every rank
            if not math.isfinite(train_loss):  # stop before the update: the last checkpoint stays good
                raise tk.non_finite(f"training loss ({train_loss}) at iter {iter_num} (lr {lr:.3g}), stopped before "
                                    "the update", ckpt_path, C, dtype)
            if C.grad_clip > 0:
                scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), C.grad_clip)
            scaler.step(optimizer)  # (float16: skipped when the gradients overflowed)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num, loss_sum, loss_steps = iter_num + 1, loss_sum + train_loss, loss_steps + 1
            if iter_num % C.log_interval == 0 or iter_num == C.max_iters:
                dt, t_log = (time.time() - t_log) / C.log_interval, time.time()
                say(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.2e}, {1000 * dt:.0f} ms/iter", flush=True)
        if d.is_master:
            tk.release_out_dir(C.out_dir)
    return record


if __name__ == "__main__":
    tk.run_cli(main, sys.argv[1:])
