"""
Train or fine-tune ToST-ViT (the Token Statistics Transformer for images), or the softmax
baseline of the same size (--attn=softmax), for image classification.

    python vit_train.py config/vit_cpu.py                  # CPU, built-in "shapes" data, minutes
    torchrun --standalone --nproc_per_node=8 vit_train.py config/vit_tost_s.py   # ImageNet-1k
    python vit_train.py config/vit_finetune.py --finetune_from=out-vit-tost-s/ckpt.pt --dataset=cifar10

Settings are the module globals below, overridden by config files (positional arguments) and
then --key=value (trainkit.configure). Conventions shared with train.py: see trainkit.py.

Data (`dataset`): "shapes" (built in: ten shapes drawn with torch at random size, rotation,
position and colours on textured backgrounds, chance 1/10, learnable on a CPU);
"cifar10", "cifar100", "imagenet-1k" through Hugging Face `datasets`; "folder": data_dir/train/
<class>/* and data_dir/val/<class>/* (or one tree of class folders, val_fraction held out),
decoded with Pillow.

Recipes (`recipe`): "builtin" needs nothing more (random resized crop, horizontal flip, mixup /
cutmix, label smoothing; every draw is a function of (seed, epoch, position), whatever the number
of processes); "paper" is the paper's ImageNet recipe through timm (RandAugment, random erasing,
repeated augmentation, bicubic resizing: the settings marked recipe="paper"; pip install timm, README).
Checkpoints (out_dir/ckpt.pt, atomic) resume exactly; one JSON line per evaluation in log.jsonl.
"""

import math
import os
import random
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

import trainkit
from model import ToSTViT, ViTConfig
from model import TSSA_IMPLS as _TSSA_IMPLS  # (a leading _: not a setting)

# -----------------------------------------------------------------------------
# settings
out_dir = "out-vit"
init_from = "scratch"  # "scratch" | "resume" (out_dir/ckpt.pt) | "finetune" (finetune_from, new head)
finetune_from = ""
eval_interval = 500  # iterations between evaluations (and checkpoints)
log_interval = 20  # iterations between progress lines
eval_max_images = 0  # 0: the whole validation split
always_save_checkpoint = True  # False: save only when val accuracy improves
# data
dataset = "shapes"  # "shapes" | "cifar10" | "cifar100" | "imagenet-1k" | "folder"
data_dir = ""
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
# model (the checkpoint's architecture is used for resume / finetune)
n_layer = 6
n_head = 4
n_embd = 192
patch_size = 4
mlp_ratio = 4.0
dropout = 0.0
drop_path = 0.0  # stochastic depth, the same rate in every ToST block
layer_scale_init = 1.0
attn = "tssa"  # "tssa" | "softmax" | "linear"
pi = "softmax"  # "softmax" | "uniform" (ablation)
n_cls_layers = 2
tssa_impl = "torch"
# optimisation
batch_size = 128  # images per process per micro-step
gradient_accumulation_steps = 1  # micro-steps per optimizer step over all processes
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
device = "auto"
dtype = "auto"
compile = False
num_threads = 0  # CPU threads for torch (0: torch's default)
sync_bn = True  # under DDP on GPUs: SyncBatchNorm in the patch embedding
seed = 1337
DEFAULTS = trainkit.config_defaults(globals())
# -----------------------------------------------------------------------------

HF_DATASETS = {  # name -> (hub id, image column, label column, train split, val split)
    "cifar10": ("uoft-cs/cifar10", "img", "label", "train", "test"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label", "train", "test"),
    "imagenet-1k": ("ILSVRC/imagenet-1k", "image", "label", "train", "validation"),
}
MEAN_STD = {"shapes": ((0.5,) * 3, (0.5,) * 3), "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
MODEL_KEYS = ("img_size", "patch_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "dropout", "drop_path",
              "layer_scale_init", "attn", "pi", "n_cls_layers")


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
    if not 2 <= num_classes <= len(SHAPES):
        raise trainkit.UserError(f"shapes_num_classes must be in 2..{len(SHAPES)}, got {num_classes}")
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
    with Image.open(path) as im:
        return rgb_tensor(im)


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
    """root/<class>/<files> -> (paths, labels, classes), classes sorted by name."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    paths, labels = [], []
    for k, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name))):
            found = [os.path.join(dirpath, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
            paths += found
            labels += [k] * len(found)
    if not paths:
        raise FileNotFoundError(f"no images in class sub-folders of {root!r}; expected root/<class>/<image files>")
    return paths, labels, classes


def folder_sources(data_dir, val_fraction):
    """data_dir/train + data_dir/val (or validation/test), or one tree split per class."""
    if not data_dir or not os.path.isdir(data_dir):
        raise FileNotFoundError(f"dataset='folder' needs data_dir=<a folder> holding train/<class>/<images> and "
                                f"val/<class>/<images>, or <class>/<images>; got {data_dir!r}")
    val_dir = next((os.path.join(data_dir, d) for d in ("val", "validation", "test")
                    if os.path.isdir(os.path.join(data_dir, d))), None)
    if os.path.isdir(os.path.join(data_dir, "train")) and val_dir:
        tp, tl, classes = scan_image_folder(os.path.join(data_dir, "train"))
        vp, vl, vclasses = scan_image_folder(val_dir)
        if set(vclasses) - set(classes):
            raise trainkit.UserError(f"{val_dir} has classes that train/ lacks: {sorted(set(vclasses) - set(classes))[:5]}")
        vl = [classes.index(vclasses[k]) for k in vl]
        return Source(tp, tl, classes, load_image), Source(vp, vl, classes, load_image)
    paths, labels, classes = scan_image_folder(data_dir)
    train_paths, val_paths = [], []
    for k in range(len(classes)):  # the last val_fraction of each class (in name order) is held out
        mine = [p for p, lab in zip(paths, labels) if lab == k]
        cut = len(mine) - int(round(val_fraction * len(mine)))
        train_paths += mine[:cut]
        val_paths += mine[cut:]
    label_of = dict(zip(paths, labels))
    return tuple(Source(ps, [label_of[p] for p in ps], classes, load_image) for ps in (train_paths, val_paths))


def hf_sources(name):
    """CIFAR-10/100 (decoded into memory once) or ImageNet-1k (decoded on demand)."""
    import datasets
    hub_id, image_key, label_key, train_split, val_split = HF_DATASETS[name]
    try:
        splits = [datasets.load_dataset(hub_id, split=s) for s in (train_split, val_split)]
    except Exception as e:  # no network, offline mode, gated repository, ...
        raise trainkit.UserError(
            f"could not load {hub_id!r} through Hugging Face datasets ({type(e).__name__}: {str(e)[:200]}); it "
            "needs the network the first time (imagenet-1k: accept its terms, `huggingface-cli login`). "
            "Without it: dataset='folder' with data_dir=<image tree>, or dataset='shapes'") from e
    classes = splits[0].features[label_key].names
    if name == "imagenet-1k":
        return tuple(Source(ds, ds[label_key], classes, lambda row: rgb_tensor(row[image_key])) for ds in splits)
    return tuple(Source(torch.stack([rgb_tensor(im) for im in ds[image_key]]), ds[label_key], classes)
                 for ds in splits)


def build_sources(cfg):
    """(train source, val source) for cfg["dataset"]."""
    name = cfg["dataset"]
    if name == "shapes":
        n_cls, size, s = cfg["shapes_num_classes"], cfg["shapes_source_size"], 2 * cfg["shapes_seed"]
        return tuple(Source(*make_shapes(n, size, n_cls, seed=s + i), SHAPES[:n_cls])
                     for i, n in enumerate((cfg["shapes_train_size"], cfg["shapes_val_size"])))
    if name == "folder":
        return folder_sources(cfg["data_dir"], cfg["val_fraction"])
    trainkit.require(name in HF_DATASETS, f"unknown dataset {name!r}; use shapes, folder (with data_dir) or one "
                                          f"of {sorted(HF_DATASETS)}")
    return hf_sources(name)


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

    def __init__(self, source, cfg, train, timm_transform=None):
        self.source, self.cfg, self.train, self.transform = source, cfg, train, timm_transform

    def __len__(self):
        return len(self.source)

    def __getitem__(self, key):
        epoch, slot, index = key if self.train else (0, key, key)
        img, label = self.source.get(index)
        seed = [self.cfg["seed"], epoch, slot]
        if self.transform is not None:
            return self._timm(img, seed), label
        size = self.cfg["img_size"]
        if not self.train:
            return center_crop(img, size, self.cfg["eval_crop_pct"]), label
        rng = np.random.default_rng(seed)
        top, left, h, w = random_resized_crop_box(img.shape[1], img.shape[2], self.cfg["crop_scale"], rng)
        img = resize(img[:, top:top + h, left:left + w], (size, size))
        return (img.flip(-1) if self.cfg["hflip"] and rng.random() < 0.5 else img), label

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
        finally:  # not trainkit.set_rng_state: that touches CUDA, which a forked worker must not
            random.setstate(state[0])
            np.random.set_state(state[1])
            torch.set_rng_state(state[2])


def timm_transforms(cfg):
    """(train, eval) transforms of the paper's recipe, built by timm."""
    try:
        from timm.data import create_transform
    except ImportError as e:
        raise trainkit.UserError(f"recipe='paper' needs timm ({e}); see the README: pip install timm "
                                 "(--no-deps next to a CPU torch), or recipe='builtin'") from None
    from timm.data.auto_augment import posterize
    try:  # RandAugment at magnitude 10 (rand-m9-mstd0.5 reaches it) keeps 0 bits: Pillow 13 refuses that
        posterize(Image.new("RGB", (1, 1)), 0)
    except ValueError as e:
        raise trainkit.UserError(f"timm's RandAugment posterizes to 0 bits, which this Pillow refuses ({e}); "
                                 "install Pillow<13 next to timm (README)") from None
    mean, std = mean_std(cfg["dataset"])
    common = dict(input_size=cfg["img_size"], interpolation="bicubic", mean=mean, std=std)
    train = create_transform(**common, is_training=True, scale=tuple(cfg["crop_scale"]),
                             hflip=0.5 if cfg["hflip"] else 0.0, auto_augment=cfg["randaugment"] or None,
                             re_prob=cfg["random_erasing"], re_mode="pixel", re_count=1)
    return train, create_transform(**common, is_training=False, crop_pct=cfg["eval_crop_pct"])


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
            raise trainkit.UserError(f"the training set ({n} images over {world_size} processes) is smaller than "
                                     f"one batch ({batch_size}); lower batch_size")

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


def make_mixer(cfg, num_classes):
    """(inputs, labels, global micro-step) -> (inputs, soft targets) of the recipe."""
    if cfg["recipe"] == "paper" and (cfg["mixup"] > 0 or cfg["cutmix"] > 0):
        from timm.data import Mixup  # its draws come from numpy's global generator (checkpointed)
        timm_mix = Mixup(mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"], prob=cfg["mix_prob"],
                         label_smoothing=cfg["label_smoothing"], num_classes=num_classes)
        return lambda x, labels, step: timm_mix(x, labels)

    def builtin(x, labels, step):
        rng = np.random.default_rng([cfg["seed"], step])
        target = smooth_targets(labels, num_classes, cfg["label_smoothing"])
        return mix_batch(x, target, rng, cfg["mixup"], cfg["cutmix"], cfg["mix_prob"])[:2]
    return builtin


# -----------------------------------------------------------------------------
# 3. Model, checkpoints, evaluation


def model_from_checkpoint(ckpt, **overrides):
    """Rebuild the model a checkpoint of this script holds (on the CPU)."""
    model = ToSTViT(ViTConfig(**{**ckpt["model_args"], **overrides}))
    model.load_state_dict(trainkit.clean_state_dict(ckpt["model"]))
    return model


def build_model(cfg, num_classes):
    """(model, checkpoint or None) for init_from = scratch / resume / finetune."""
    if cfg["init_from"] == "scratch":
        args = {k: cfg[k] for k in MODEL_KEYS}
        return ToSTViT(ViTConfig(**args, num_classes=num_classes, tssa_impl=cfg["tssa_impl"])), None
    if cfg["init_from"] == "resume":
        ckpt = trainkit.load_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"))
        if ckpt["model_args"]["num_classes"] != num_classes:
            raise trainkit.UserError(f"the checkpoint has {ckpt['model_args']['num_classes']} classes, dataset "
                                     f"{cfg['dataset']!r} has {num_classes}; init_from='finetune' gives a new head")
        return model_from_checkpoint(ckpt, tssa_impl=cfg["tssa_impl"]), ckpt
    trainkit.require(cfg["init_from"] == "finetune",
                     f"init_from must be scratch, resume or finetune, got {cfg['init_from']!r}")
    trainkit.require(cfg["finetune_from"], "init_from='finetune' needs finetune_from=<path to a ckpt.pt>")
    ckpt = trainkit.load_checkpoint(cfg["finetune_from"])  # its architecture; this run's size, regularisation
    model = model_from_checkpoint(ckpt, img_size=cfg["img_size"], dropout=cfg["dropout"],
                                  drop_path=cfg["drop_path"], tssa_impl=cfg["tssa_impl"])
    if model.config.num_classes != num_classes:
        model.reset_classifier(num_classes)
    return model, None


@torch.no_grad()
def evaluate(model, loader, dev, ctx, d, dataset_name):
    """(accuracy, cross-entropy) over the loader, summed over all processes."""
    model.eval()
    sums = torch.zeros(3, device=dev, dtype=torch.float64)  # correct, loss sum, count
    for images, labels in loader:
        labels = labels.to(dev)
        with ctx():
            logits = model(to_input(images, dataset_name, dev))
        sums += torch.stack([(logits.argmax(-1) == labels).sum().double(),
                             F.cross_entropy(logits.float(), labels, reduction="sum").double(),
                             torch.tensor(labels.numel(), device=dev, dtype=torch.float64)])
    if d.ddp:
        torch.distributed.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


# -----------------------------------------------------------------------------
# 4. Training


def loaders(cfg, train_src, val_src, d, start):
    """(iterator over this process's training batches from micro-step `start`, val loader)."""
    transforms = timm_transforms(cfg) if cfg["recipe"] == "paper" else (None, None)
    repeats = cfg["repeated_aug"] if cfg["recipe"] == "paper" else 1
    batches = TrainBatches(len(train_src), cfg["batch_size"], d.rank, d.world_size, cfg["seed"], start, repeats)
    n = len(val_src) if cfg["eval_max_images"] <= 0 else min(len(val_src), cfg["eval_max_images"])
    mine = list(range(d.rank, n, d.world_size))
    val_batches = [mine[i:i + cfg["batch_size"]] for i in range(0, len(mine), cfg["batch_size"])]

    def loader(view, batches, pin_memory=False):  # shuffles with its own generator, not the global RNG
        return torch.utils.data.DataLoader(view, batch_sampler=batches, num_workers=cfg["num_workers"],
                                           pin_memory=pin_memory, generator=torch.Generator().manual_seed(0))

    train_loader = loader(View(train_src, cfg, True, transforms[0]), batches, d.device.startswith("cuda"))
    val_loader = loader(View(val_src, cfg, False, transforms[1]), val_batches)
    return iter(train_loader), val_loader


def train(cfg, d):
    trainkit.require(cfg["recipe"] in ("builtin", "paper"), f"recipe must be builtin or paper, got {cfg['recipe']!r}")
    trainkit.require(cfg["attn"] in ("tssa", "softmax", "linear"), f"attn must be tssa, softmax or linear, got {cfg['attn']!r}")
    trainkit.require(cfg["tssa_impl"] in _TSSA_IMPLS,
                     f"tssa_impl must be one of {', '.join(_TSSA_IMPLS)}, got {cfg['tssa_impl']!r}")
    dev, dtype_name = trainkit.choose_device_dtype(d.device, cfg["dtype"])
    accum = cfg["gradient_accumulation_steps"]
    trainkit.require(accum % d.world_size == 0, f"gradient_accumulation_steps ({accum}) must be divisible by the "
                                                f"number of processes ({d.world_size})")
    accum //= d.world_size  # micro-steps per process
    torch.manual_seed(cfg["seed"] + d.rank)
    np.random.seed(cfg["seed"] + d.rank)
    random.seed(cfg["seed"] + d.rank)
    ctx, scaler = trainkit.autocast_for(dev, dtype_name)
    if cfg["init_from"] != "resume":  # a new run never overwrites another run's checkpoint
        trainkit.refuse_overwrite(cfg["out_dir"])
    train_src, val_src = build_sources(cfg)
    num_classes = len(train_src.classes)
    model, ckpt = build_model(cfg, num_classes)
    model.to(dev)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                           "cuda" if dev.startswith("cuda") else "cpu")
    iter_num, best_acc, best_loss, resumed_at = 0, 0.0, float("inf"), None
    if ckpt is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        iter_num, best_acc, best_loss = ckpt["iter_num"], ckpt["best_val_acc"], ckpt["best_val_loss"]
        resumed_at = iter_num  # written right after evaluating at this iteration
        states = ckpt["rng"]
        trainkit.set_rng_state(states[d.rank] if len(states) == d.world_size else states[0])
        del ckpt
    raw_model = model
    if d.ddp and cfg["sync_bn"] and dev.startswith("cuda"):
        model = raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg["compile"]:
        model = torch.compile(model)
    if d.ddp:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[d.local_rank] if dev.startswith("cuda") else None)
    train_iter, val_loader = loaders(cfg, train_src, val_src, d, start=iter_num * accum)
    mixer = make_mixer(cfg, num_classes)
    logger = trainkit.JsonlLogger(os.path.join(cfg["out_dir"], "log.jsonl"), enabled=d.is_master,
                                  fresh=cfg["init_from"] != "resume")
    if d.is_master:
        print(f"{cfg['attn']} ViT: {raw_model.get_num_params() / 1e6:.2f}M parameters, {num_classes} classes, "
              f"{len(train_src)} train / {len(val_src)} val images, {d.world_size} process(es) on {dev}, "
              f"{dtype_name}, recipe {cfg['recipe']}, batch {cfg['batch_size'] * accum * d.world_size}")

    def save():
        states = trainkit.gather_rng_states(d)  # every rank takes part
        if d.is_master:
            trainkit.save_checkpoint({
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "model_args": {**{k: getattr(raw_model.config, k) for k in MODEL_KEYS},
                               "num_classes": raw_model.config.num_classes},
                "iter_num": iter_num, "best_val_loss": best_loss, "best_val_acc": best_acc, "config": cfg,
                "classes": train_src.classes, "rng": states}, os.path.join(cfg["out_dir"], "ckpt.pt"))

    record, t_start, t_log, lr = {}, time.time(), time.time(), 0.0
    loss_sum, loss_steps = torch.zeros((), device=dev), 0  # training losses since the last evaluation
    while True:
        if (iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]) and iter_num != resumed_at:
            acc, val_loss = evaluate(model, val_loader, dev, ctx, d, cfg["dataset"])
            improved = acc > best_acc
            best_acc, best_loss = max(best_acc, acc), min(best_loss, val_loss)
            train_loss = trainkit.all_reduce_mean(loss_sum, d).item() / loss_steps if loss_steps else None
            loss_sum, loss_steps = torch.zeros((), device=dev), 0
            record = {"iter": iter_num, "lr": lr, "train_loss": train_loss, "val_loss": val_loss, "val_acc": acc,
                      "time_s": time.time() - t_start}
            logger.log(record)
            if d.is_master:
                print(f"eval iter {iter_num}: val acc {100 * acc:.2f}%, val loss {val_loss:.4f}, train loss "
                      f"{'-' if train_loss is None else f'{train_loss:.4f}'}", flush=True)
            if train_loss is not None and not math.isfinite(train_loss):
                raise trainkit.UserError(f"non-finite training loss at iteration {iter_num}; the last good checkpoint "
                                         f"is in {cfg['out_dir']}: try a lower learning_rate or grad_clip=1.0")
            if cfg["always_save_checkpoint"] or improved or iter_num == cfg["max_iters"]:
                save()
        if iter_num >= cfg["max_iters"]:
            return record
        lr = trainkit.lr_at(iter_num, lr=cfg["learning_rate"], min_lr=cfg["min_lr"], warmup_iters=cfg["warmup_iters"],
                            decay_iters=cfg["lr_decay_iters"] or cfg["max_iters"], schedule=cfg["lr_schedule"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(accum):
            images, labels = next(train_iter)
            step = (iter_num * accum + micro) * d.world_size + d.rank  # the global micro-batch number
            x, target = mixer(to_input(images, cfg["dataset"], dev), labels.to(dev), step)  # (B, 3, S, S), (B, K)
            with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                with ctx():
                    logits = model(x)  # (B, K)
                loss = -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean() / accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.detach()
        trainkit.optimizer_step(optimizer, model.parameters(), cfg["grad_clip"], scaler)
        iter_num, loss_steps = iter_num + 1, loss_steps + 1
        if d.is_master and (iter_num % cfg["log_interval"] == 0 or iter_num == cfg["max_iters"]):
            dt, t_log = (time.time() - t_log) / cfg["log_interval"], time.time()
            print(f"iter {iter_num}: loss {loss.item() * accum:.4f}, lr {lr:.2e}, {1000 * dt:.0f} ms/iter", flush=True)


def main(argv=None):
    cfg = trainkit.configure(DEFAULTS, sys.argv[1:] if argv is None else argv)
    if cfg["num_threads"] > 0:
        torch.set_num_threads(cfg["num_threads"])
    device_name, _ = trainkit.choose_device_dtype(cfg["device"], cfg["dtype"])
    with trainkit.distributed(device_name) as d:
        return train(cfg, d)


if __name__ == "__main__":
    trainkit.run_cli(main)
