"""
The images of vit_train.py and vit_inspect.py: where they come from, how a recipe sees them,
and the model a checkpoint holds. Every image is uint8 (3, H, W) until to_input() normalises
a batch on the device.

1. Data (`dataset`): "shapes" (built in: ten shapes drawn with torch at random size, rotation,
   position and colours on textured backgrounds, chance 1/10, learnable on a CPU); "cifar10",
   "cifar100", "imagenet-1k" through Hugging Face `datasets`; "folder": data_dir/train/<class>/*
   and data_dir/val/<class>/* (or one tree of class folders, the last val_fraction of each class
   held out). Every file of a class folder (hidden files aside) must be an image Pillow reads:
   each is opened once at the start, and anything else is named, before any work.
2. Recipes (`recipe`): "builtin" needs nothing more (random resized crop, horizontal flip, mixup /
   cutmix, label smoothing); "paper" is the paper's ImageNet recipe through timm (RandAugment,
   random erasing, repeated augmentation, bicubic resizing; pip install timm, README). Every draw
   is a function of (seed, epoch, position), whatever the number of processes or workers, so a
   resumed run sees what the uninterrupted one saw (TrainBatches, View).
3. The loaders of one process, the recipe's mixing, and load_vit_model (a checkpoint's model).
"""

import math
import os
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from nanotost import cli, devices

HF_DATASETS = {  # name -> (hub id, image column, label column, train split, val split)
    "cifar10": ("uoft-cs/cifar10", "img", "label", "train", "test"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label", "train", "test"),
    "imagenet-1k": ("ILSVRC/imagenet-1k", "image", "label", "train", "validation"),
}
MEAN_STD = {"shapes": ((0.5,) * 3, (0.5,) * 3), "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
            "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def mean_std(name):
    """The normalisation of a dataset: (mean, std) per channel."""
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


def eight_bit(im):
    """A Pillow image in a mode whose convert("RGB") / convert("L") keeps what it shows. Greyscale
    deeper than 8 bits (16-bit PNGs open as I;16 or I) is scaled from 0..65535 to 0..255: Pillow's
    own conversion would clip it at 255, a white image. Float images (F) and integers outside 16
    bits are refused (ValueError); every other mode converts as it is (lra/data.py reads its
    images through this too)."""
    if im.mode == "I" or im.mode.startswith("I;16"):
        grey = np.asarray(im, dtype=np.int64)  # (H, W)
        if grey.size and (grey.min() < 0 or grey.max() > 65535):
            raise ValueError(f"{im.mode} image with values outside 0..65535 (min {grey.min()}, max {grey.max()})")
        return Image.fromarray(((grey * 255 + 32767) // 65535).astype(np.uint8), mode="L")
    if im.mode == "F":
        raise ValueError("32-bit float pixels (mode F) have no standard range; save it as an 8- or 16-bit image")
    return im


def rgb_tensor(im):
    """A Pillow image -> uint8 (3, H, W), RGB (through eight_bit: no mode comes out clipped)."""
    return torch.from_numpy(np.array(eight_bit(im).convert("RGB"))).permute(2, 0, 1).contiguous()


def load_image(path):
    """An image file -> uint8 (3, H, W); a file Pillow cannot decode is a UserError naming it."""
    try:
        with Image.open(path) as im:
            return rgb_tensor(im)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise cli.UserError(f"cannot decode {path} as an image ({type(e).__name__}: {' '.join(str(e).split())}): "
                            "remove or replace it") from None


def check_image(path):
    """Open `path` with Pillow and check what it can without decoding; anything else is named."""
    try:
        with Image.open(path) as im:
            mode = im.mode
            im.verify()
    except Exception as e:  # UnidentifiedImageError, truncated or damaged data, decompression bombs, ...
        why = "not an image format Pillow knows" if isinstance(e, Image.UnidentifiedImageError) else \
            f"{type(e).__name__}: {' '.join(str(e).split())}"
        raise cli.UserError(f"{path} is not a readable image ({why}): remove it "
                            "(class folders hold only images)") from None
    if mode == "F":
        raise cli.UserError(f"{path} has 32-bit float pixels, which have no standard range: save it as an 8- or "
                            "16-bit image, or remove it")


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
            raise cli.UserError(f"class folder {os.path.join(root, name)} holds no images: add some, or remove it")
    if not classes:
        raise cli.UserError(f"{root} holds no class folders: expected {root}/<class>/<images>, one folder per class")
    with ThreadPoolExecutor(min(16, 4 * devices.cpu_cores())) as pool:  # file system latency: threads overlap it
        list(pool.map(check_image, [p for name in classes for p in files[name]]))
    return files


def folder_sources(data_dir, val_fraction):
    """data_dir/train + data_dir/val (or validation/test), or one tree (data_dir, or data_dir/train
    alone) whose last val_fraction of each class (in name order) is held out."""
    if not os.path.isdir(data_dir):
        what = "is a file" if os.path.exists(data_dir) else "does not exist"
        raise cli.UserError(f"data_dir={data_dir!r} {what}: give --data_dir=<folder> holding train/<class>/<images> "
                            "and val/<class>/<images>, or <class>/<images>")
    train_dir = os.path.join(data_dir, "train") if os.path.isdir(os.path.join(data_dir, "train")) else data_dir
    val_dir = next((os.path.join(data_dir, d) for d in ("val", "validation", "test")
                    if os.path.isdir(os.path.join(data_dir, d))), None)
    cli.require(train_dir != data_dir or val_dir is None,
                f"{val_dir} has no train/ beside it: give {data_dir}/train/<class>/<images> too")
    files = scan_image_folder(train_dir)
    classes = list(files)
    if len(classes) < 2:
        raise cli.UserError(f"{train_dir} holds one class folder ({classes[0]}); classification needs at least 2: "
                            f"{train_dir}/<class>/<images>, one folder per class")
    if val_dir is not None:
        val_files = scan_image_folder(val_dir)
        extra = sorted(set(val_files) - set(classes))
        if extra:
            raise cli.UserError(f"{val_dir} has classes that {train_dir} lacks: {', '.join(extra[:5])}: "
                                "give every val class a train folder")
    else:
        val_files = {}
        for name, paths in files.items():
            n_val = int(round(val_fraction * len(paths)))
            if not 0 < n_val < len(paths):
                raise cli.UserError(f"class {name!r} has {len(paths)} image(s): val_fraction={val_fraction} leaves "
                                    f"{len(paths) - n_val} to train and {n_val} to validate, and each needs at least "
                                    f"1: add images, change --val_fraction, or give {data_dir}/train and "
                                    f"{data_dir}/val")
            files[name], val_files[name] = paths[:-n_val], paths[-n_val:]
    label = {name: k for k, name in enumerate(classes)}
    return tuple(Source([p for name in split for p in split[name]],
                        [label[name] for name in split for _ in split[name]], classes, load_image)
                 for split in (files, val_files))


def build_sources(cfg):
    """(train source, val source) for cfg.dataset."""
    if cfg.dataset == "shapes":
        n, s = cfg.shapes_num_classes, 2 * cfg.shapes_seed
        return tuple(Source(*make_shapes(size, cfg.shapes_source_size, n, seed=s + i), SHAPES[:n])
                     for i, size in enumerate((cfg.shapes_train_size, cfg.shapes_val_size)))
    if cfg.dataset == "folder":
        return folder_sources(cfg.data_dir, cfg.val_fraction)
    import datasets  # CIFAR-10/100 (decoded into memory once) or ImageNet-1k (decoded on demand)
    hub_id, image_key, label_key, train_split, val_split = HF_DATASETS[cfg.dataset]
    online = devices.hub_reachable()  # offline: the cache or nothing, at once (no ~25 s of retries)
    try:
        splits = [datasets.load_dataset(hub_id, split=s) for s in (train_split, val_split)]
    except Exception as e:  # no network, offline mode, gated repository, ...
        if isinstance(e, OSError) and e.filename:  # the cache's folder cannot be written: run_cli names it
            raise
        why = " ".join(str(e).split())[:200] + ("" if online else "; offline: the Hub was not reached")
        raise cli.UserError(
            f"could not load {hub_id!r} through Hugging Face datasets ({type(e).__name__}: {why}); "
            "it needs the network the first time, into the Hugging Face cache (HF_HOME) (imagenet-1k: accept its "
            "terms, `hf auth login`). Without it: --dataset=folder --data_dir=<image tree>, or "
            "--dataset=shapes") from None
    classes = splits[0].features[label_key].names
    if cfg.dataset == "imagenet-1k":
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

    def __init__(self, source, cfg, train, timm_transform=None):
        self.source, self.cfg, self.train, self.transform = source, cfg, train, timm_transform

    def __len__(self):
        return len(self.source)

    def __getitem__(self, key):
        epoch, slot, index = key if self.train else (0, key, key)
        img, label = self.source.get(index)
        seed = [self.cfg.seed, epoch, slot]
        if self.transform is not None:
            return self._timm(img, seed), label
        size = self.cfg.img_size
        if not self.train:
            return center_crop(img, size, self.cfg.eval_crop_pct), label
        rng = np.random.default_rng(seed)
        top, left, h, w = random_resized_crop_box(img.shape[1], img.shape[2], self.cfg.crop_scale, rng)
        img = resize(img[:, top:top + h, left:left + w], (size, size))
        return (img.flip(-1) if self.cfg.hflip and rng.random() < 0.5 else img), label

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


def timm_transforms(cfg):
    """(train, eval) transforms of the paper's recipe, built by timm."""
    try:
        from timm.data import create_transform
    except ImportError as e:
        raise cli.UserError(f"recipe='paper' needs timm ({e}): pip install timm (the README says how next to a "
                            "CPU torch), or --recipe=builtin") from None
    from timm.data.auto_augment import posterize
    try:  # RandAugment at magnitude 10 (rand-m9-mstd0.5 reaches it) keeps 0 bits: Pillow 13 refuses that
        posterize(Image.new("RGB", (1, 1)), 0)
    except ValueError as e:
        raise cli.UserError(f"timm's RandAugment posterizes to 0 bits, which this Pillow refuses ({e}): "
                            "install Pillow<13 next to timm (README)") from None
    mean, std = mean_std(cfg.dataset)
    common = dict(input_size=cfg.img_size, interpolation="bicubic", mean=mean, std=std)
    train = create_transform(**common, is_training=True, scale=tuple(cfg.crop_scale),
                             hflip=0.5 if cfg.hflip else 0.0, auto_augment=cfg.randaugment or None,
                             re_prob=cfg.random_erasing, re_mode="pixel", re_count=1)
    return train, create_transform(**common, is_training=False, crop_pct=cfg.eval_crop_pct)


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
            raise cli.UserError(f"the training set ({n} images over {world_size} process(es)) is smaller than "
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
# 3. One process's loaders, the recipe's mixing, a checkpoint's model


def loaders(train_src, val_src, cfg, d, start):
    """(train loader, val loader) of this process (d: ranks.distributed's): its training
    micro-batches from its local micro-step `start` on, and its share of the first
    eval_max_images validation images (all when 0). A training set smaller than one batch
    per process is refused here."""
    transforms = timm_transforms(cfg) if cfg.recipe == "paper" else (None, None)
    batches = TrainBatches(len(train_src), cfg.batch_size, d.rank, d.world_size, cfg.seed, start,
                           cfg.repeated_aug if cfg.recipe == "paper" else 1)
    n_val = len(val_src) if cfg.eval_max_images == 0 else min(len(val_src), cfg.eval_max_images)
    mine = list(range(d.rank, n_val, d.world_size))
    val_batches = [mine[i:i + cfg.batch_size] for i in range(0, len(mine), cfg.batch_size)]

    def loader(view, sampler, pin):  # its own generator, not the global one (checkpointed RNGs stay put)
        return torch.utils.data.DataLoader(view, batch_sampler=sampler, num_workers=cfg.num_workers, pin_memory=pin,
                                           generator=torch.Generator().manual_seed(0))

    return (loader(View(train_src, cfg, True, transforms[0]), batches, d.device.startswith("cuda")),
            loader(View(val_src, cfg, False, transforms[1]), val_batches, False))


def mixer(cfg, num_classes):
    """The recipe's mixing: mix(x, labels, step) -> (inputs, soft targets (B, K)), step the
    global micro-batch number. Built in: label smoothing, then mix_batch drawn from (seed, step);
    "paper" with mixup or cutmix: timm's Mixup (its draws come from numpy's global generator,
    which the checkpoint holds)."""
    if cfg.recipe == "paper" and (cfg.mixup > 0 or cfg.cutmix > 0):
        from timm.data import Mixup
        timm_mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mix_prob,
                           label_smoothing=cfg.label_smoothing, num_classes=num_classes)
        return lambda x, labels, step: timm_mixup(x, labels)

    def mix(x, labels, step):
        target = smooth_targets(labels, num_classes, cfg.label_smoothing)
        return mix_batch(x, target, np.random.default_rng([cfg.seed, step]), cfg.mixup, cfg.cutmix, cfg.mix_prob)[:2]

    return mix


