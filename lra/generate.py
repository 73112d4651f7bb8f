"""
Generators for the two synthetic Long Range Arena tasks, writing the same files as the
official release so that lra/data.py reads either without change.

ListOps (Nangia & Bowman 2018, as configured by LRA): nested prefix expressions over the
digits 0-9 with MIN, MAX, MED (median, rounded down) and SM (sum mod 10); each operator
takes 2..max_args arguments, nodes sit at depth <= max_depth, and a sequence keeps between
min_len and max_len tokens (exclusive, counting operators, digits and "]"). The label is the
value of the expression. Written as listops-1000/basic_{train,val,test}.tsv with a
"Source\tTarget" header, in the release's text format, which brackets the argument list
pairwise with parentheses (the loaders drop them):
    [MAX 4 3 ]  is written  ( ( ( [MAX 4 ) 3 ) ] )

Pathfinder (Linsley et al. 2018): a black image with two long, smooth, dashed white paths
and a few short distractor paths, none of which touch, and two round end markers. Label 1
when both markers sit on the two ends of the same path, 0 when they sit on ends of the
two different long paths. Labels are balanced. Written as
pathfinder{size}/curv_contour_length_14/imgs/<k>/sample_<i>.png plus text metadata files
metadata/<k>.npy with one line per image: "imgs/<k> sample_<i>.png <i> <label> ...".

    python lra/generate.py --task=listops --out_dir=data/lra_gen            # 96k/2k/2k, slow-ish
    python lra/generate.py --task=listops --n_train=2000 --min_len=10 --max_len=60 --max_depth=3
    python lra/generate.py --task=pathfinder --size=32 --n_images=20000 --workers=2

Progress bars show the work as it goes; Pathfinder's images are drawn by --workers processes
(0, the default: one per core this process may use). Every count and size is checked before
anything is written; every file is written atomically (atomic.atomic_write), ListOps's three
splits together (all or none: atomic.write_together), and Pathfinder's set is drawn in a folder
that takes its name at the end, so a failed or killed run leaves no partial file and no set
that looks whole. An out_dir that already holds the task's set is refused, never overwritten.
"""

import os
import random
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from PIL import Image
from tqdm import tqdm

if __package__ in (None, ""):  # run as a script: make `lra` and the repo's modules importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lra.data import TASKS
from nanotost import atomic, cli, devices, outputs


# -----------------------------------------------------------------------------
# ListOps

LISTOPS_OPS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_END = "]"
P_OPERATOR = 0.25  # a node above the depth limit is an operator with this probability, else a digit


class _TooLong(Exception):
    pass


def random_listops_tree(rng, max_depth, max_args, budget):
    """A random expression: an int (digit) or (operator, [children]). Raises _TooLong as
    soon as it has more than `budget` tokens (such trees are rejected anyway)."""
    count = [0]

    def grow(depth):
        if depth >= max_depth or rng.random() >= P_OPERATOR:
            count[0] += 1
            if count[0] > budget:
                raise _TooLong
            return rng.randrange(10)
        count[0] += 2  # the operator and its closing "]"
        n_args = rng.randint(2, max_args)
        children = [grow(depth + 1) for _ in range(n_args)]
        return (rng.choice(LISTOPS_OPS), children)

    return grow(1)


def listops_tokens(tree):
    """Token list without parentheses: ['[MAX', '4', '3', ']']."""
    if isinstance(tree, int):
        return [str(tree)]
    op, children = tree
    return [op] + [tok for child in children for tok in listops_tokens(child)] + [LISTOPS_END]


def listops_text(tree, parens=True):
    """The release's text: each operator's argument list bracketed pairwise with parentheses."""
    if isinstance(tree, int):
        return str(tree)
    op, children = tree
    if not parens:
        return " ".join([op] + [listops_text(c, False) for c in children] + [LISTOPS_END])
    text = "( " * (len(children) + 1) + op + " " + listops_text(children[0]) + " )"
    for child in children[1:]:
        text += " " + listops_text(child) + " )"
    return text + " " + LISTOPS_END + " )"


def listops_value(tree):
    if isinstance(tree, int):
        return tree
    op, children = tree
    args = sorted(listops_value(c) for c in children)
    if op == "[MIN":
        return args[0]
    if op == "[MAX":
        return args[-1]
    if op == "[MED":  # median, rounded down when the count is even
        mid = len(args) // 2
        return args[mid] if len(args) % 2 else (args[mid - 1] + args[mid]) // 2
    return sum(args) % 10  # [SM


def generate_listops(n, seed=0, min_len=500, max_len=2000, max_depth=10, max_args=10, parens=True):
    """n distinct (text, label) pairs whose token count lies strictly between min_len and
    max_len, in a seeded random order."""
    rng = random.Random(seed)
    seen, examples = set(), []
    tries, max_tries = 0, 2000 * n + 100_000
    with tqdm(total=n, desc="ListOps trees", unit="tree", leave=False, disable=None) as bar:  # (cleared; a terminal's)
        while len(examples) < n:
            tries += 1
            if tries > max_tries:
                raise cli.UserError(f"found only {len(examples)} of {n} distinct ListOps trees with {min_len} < "
                                    f"length < {max_len} in {max_tries} tries: widen the length range (--min_len, "
                                    "--max_len), raise --max_depth / --max_args, or ask for fewer examples")
            try:
                tree = random_listops_tree(rng, max_depth, max_args, budget=max_len - 1)
            except _TooLong:
                continue
            if not min_len < len(listops_tokens(tree)) < max_len:
                continue
            text = listops_text(tree, parens)
            if text not in seen:
                seen.add(text)
                examples.append((text, listops_value(tree)))
                bar.update(1)
    return examples


def write_listops(out_dir, n_train=96000, n_val=2000, n_test=2000, seed=0, **kw):
    """Write listops-1000/basic_{train,val,test}.tsv under out_dir; splits never share a tree.
    The three files appear together or not at all (atomic.write_together: each on disk in its temp
    file, then the three renamed in a row)."""
    examples = generate_listops(n_train + n_val + n_test, seed=seed, **kw)
    folder = os.path.join(out_dir, "listops-1000")
    bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, len(examples))}
    atomic.write_together({os.path.join(folder, f"basic_{split}.tsv"): "Source\tTarget\n" + "".join(
        f"{text}\t{label}\n" for text, label in examples[lo:hi]) for split, (lo, hi) in bounds.items()})
    return folder


# -----------------------------------------------------------------------------
# Pathfinder


@dataclass(frozen=True)
class PathfinderStyle:
    """Geometry in pixels. Defaults follow the release's 32 px settings where they are
    known (contour of 14 dashes of length 2, distractors of 14 // 3 dashes, 20 // 4 of
    them, marker radius 1.5); the line width and spacing are ours."""

    size: int = 32
    n_dashes: int = 14  # dashes per long path ("contour length 14")
    dash_len: float = 2.0
    gap: float = 1.0  # empty stretch between dashes
    width: float = 1.0  # line width
    distractor_dashes: int = 4
    n_distractors: int = 5
    marker_radius: float = 1.5
    max_turn: float = 0.6  # radians the direction may turn from one dash to the next
    clearance: float = 3.0  # least distance between the centre lines of different paths
    supersample: int = 4  # antialiasing: render at this factor, then average down


PATHFINDER_STYLES = {
    32: PathfinderStyle(),
    128: PathfinderStyle(size=128, dash_len=5.0, gap=2.5, width=1.5, n_distractors=8, marker_radius=3.0,
                         max_turn=0.45, clearance=6.0, supersample=2),
}


@dataclass
class PathfinderScene:
    """What was drawn: paths[0] and paths[1] are the long paths, the rest distractors; each
    path is an (n, 2, 2) array of dash segments (start, end) in (x, y) pixel coordinates."""

    paths: list = field(default_factory=list)
    markers: np.ndarray = None  # (2, 2) marker centres
    marker_paths: tuple = ()  # index of the path each marker sits on
    label: int = 0


def _centre_line(start, direction, length, step=0.5):
    """Points every `step` px along a straight stretch: (m, 2)."""
    t = np.arange(0.0, length + 1e-9, step)
    return start[None] + t[:, None] * direction[None]


def _fits(new, points, taken, taken_ends, style, rim):
    """Whether centre-line points `new` (m, 2) stay in the frame, keep `clearance` from other
    paths (`taken`), from the long paths' markers (`taken_ends`) and from the path's own
    stretches well behind it (`points`)."""
    c = style.clearance
    if new.min() < rim or new.max() > style.size - rim:
        return False
    far = points[: max(0, len(points) - int(3 * c / 0.5))]
    for others, least in ((taken, c), (taken_ends, c + style.marker_radius), (far, c)):
        if len(others) and np.square(new[:, None] - others[None]).sum(-1).min() < least * least:
            return False
    return True


def _grow_path(rng, style, n_dashes, taken, taken_ends, rim, budget=400, tries_per_bend=6, marked=False):
    """One path of n_dashes dashes, grown dash by dash with a random bend of at most
    max_turn; at a dead end it backs up a dash. marked: its ends may carry markers, so they
    keep clearance + marker_radius from the other paths. Returns (dashes (n, 2, 2), centre-line
    points (m, 2)) or None when the budget of attempts runs out."""
    start = rng.uniform(rim, style.size - rim, 2)
    stack, tries = [], [0] * n_dashes  # stack: (angle, dash start, dash end, centre-line points)
    while len(stack) < n_dashes and budget > 0:
        budget -= 1
        i = len(stack)
        if tries[i] >= tries_per_bend:  # dead end: forget this bend's tries, back up one dash
            tries[i] = 0
            if not stack:
                return None
            stack.pop()
            continue
        tries[i] += 1
        if i == 0:
            a, pos, lead = rng.uniform(0, 2 * np.pi), start, 0.0
        else:
            a, pos, lead = stack[-1][0] + rng.uniform(-style.max_turn, style.max_turn), stack[-1][2], style.gap
        d = np.array([np.cos(a), np.sin(a)])
        new = _centre_line(pos, d, lead + style.dash_len)  # the gap, then the dash
        points = np.concatenate([np.zeros((0, 2))] + [s[3] for s in stack])
        ok = _fits(new, points, taken, taken_ends, style, rim)
        if ok and marked and i in (0, n_dashes - 1) and len(taken):  # room for a marker at each end
            tip = new[:1] if i == 0 else new[-1:]
            ok = np.square(tip - taken).sum(-1).min() >= (style.clearance + style.marker_radius) ** 2
        if ok:
            stack.append((a, pos + lead * d, pos + (lead + style.dash_len) * d, new))
    if len(stack) < n_dashes:
        return None
    dashes = np.array([(s[1], s[2]) for s in stack])
    return dashes, np.concatenate([s[3] for s in stack])


def _render(style, scene):
    """Antialiased grey image (size, size) uint8 of the scene's dashes and markers: ink on a
    grid `supersample` times finer, then each block averaged."""
    S, size = style.supersample, style.size
    ink = np.zeros((size * S, size * S), dtype=bool)

    def paint(lo, hi, inside):  # set ink where inside(X, Y) within the box lo..hi (px)
        (c0, r0), (c1, r1) = np.floor(np.maximum(lo, 0) * S).astype(int), np.ceil(np.minimum(hi, size) * S).astype(int)
        X, Y = np.meshgrid((np.arange(c0, c1) + 0.5) / S, (np.arange(r0, r1) + 0.5) / S)  # fine pixel centres
        ink[r0:r1, c0:c1] |= inside(X, Y)

    half = style.width / 2
    for path in scene.paths:
        for a, b in path:
            ab = b - a

            def on_dash(X, Y, a=a, ab=ab):  # within half a width of the segment a..b
                t = np.clip(((X - a[0]) * ab[0] + (Y - a[1]) * ab[1]) / (ab @ ab), 0.0, 1.0)
                return np.hypot(X - (a[0] + t * ab[0]), Y - (a[1] + t * ab[1])) <= half

            paint(np.minimum(a, b) - half, np.maximum(a, b) + half, on_dash)
    r = style.marker_radius
    for centre in scene.markers:
        paint(centre - r, centre + r, lambda X, Y, c=centre: np.hypot(X - c[0], Y - c[1]) <= r)
    grey = ink.reshape(size, S, size, S).mean(axis=(1, 3))  # average each S x S block
    return np.rint(grey * 255).astype(np.uint8)


def pathfinder_sample(rng, style, label):
    """Draw one image with the given label: (uint8 (size, size), PathfinderScene)."""
    rim = style.marker_radius + 1.0  # keeps every path and marker inside the frame
    for _ in range(200):
        scene, taken, ends = PathfinderScene(label=label), np.zeros((0, 2)), np.zeros((0, 2))
        for _ in range(2):  # the two long paths
            grown = None
            for _ in range(20):
                grown = _grow_path(rng, style, style.n_dashes, taken, ends, rim, marked=True)
                if grown is not None:
                    break
            if grown is None:
                break
            dashes, points = grown
            scene.paths.append(dashes)
            taken = np.concatenate([taken, points])
            ends = np.concatenate([ends, dashes[[0, -1], [0, 1]]])
        if len(scene.paths) < 2:
            continue  # start over
        for _ in range(style.n_distractors):  # as many as fit, a few tries each
            for _ in range(4):
                grown = _grow_path(rng, style, style.distractor_dashes, taken, ends, rim, budget=60)
                if grown is not None:
                    scene.paths.append(grown[0])
                    taken = np.concatenate([taken, grown[1]])
                    break
        first_end = lambda path: path[0, 0]
        last_end = lambda path: path[-1, 1]
        if label == 1:  # both ends of the first long path
            scene.markers = np.stack([first_end(scene.paths[0]), last_end(scene.paths[0])])
            scene.marker_paths = (0, 0)
        else:  # one end of each long path
            pick = rng.integers(0, 2, 2)
            ends0 = (first_end(scene.paths[0]), last_end(scene.paths[0]))
            ends1 = (first_end(scene.paths[1]), last_end(scene.paths[1]))
            scene.markers = np.stack([ends0[pick[0]], ends1[pick[1]]])
            scene.marker_paths = (0, 1)
        return _render(style, scene), scene
    raise RuntimeError(f"could not place two paths on a {style.size} px image; loosen the style")


def _pathfinder_labels(n, seed):
    return np.random.default_rng([seed, 2**31]).permutation(np.arange(n) % 2)  # balanced


def _write_pathfinder_images(args):
    root, size, seed, items = args
    style = PATHFINDER_STYLES[size]
    for index, label, rel_path in items:
        img, _ = pathfinder_sample(np.random.default_rng([seed, index]), style, int(label))
        with atomic.atomic_write(os.path.join(root, rel_path)) as f:  # never a half-written PNG
            Image.fromarray(img).save(f, format="PNG")  # 8-bit grey
    return len(items)


def write_pathfinder(out_dir, size=32, n_images=1000, seed=0, per_folder=1000, workers=1):
    """Write pathfinder{size}/curv_contour_length_14/{imgs,metadata} under out_dir. Each image
    depends only on (seed, its index), so the result does not depend on `workers`. The set is
    drawn in a folder beside it (.curv_contour_length_14.tmp<pid>) that takes its name once every
    image and the metadata (what the loaders read) are there: a failed or interrupted run leaves
    no image behind, and a killed run's folder goes with the next run."""
    if size not in PATHFINDER_STYLES:
        raise ValueError(f"size must be one of {sorted(PATHFINDER_STYLES)}, got {size}")
    root = os.path.join(out_dir, f"pathfinder{size}", "curv_contour_length_14")
    parent, name = os.path.split(root)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(root):  # (never a set: main refuses one; a file, or a folder not ours)
        raise cli.UserError(f"{root} already exists: delete it, or write this set elsewhere with "
                            "--out_dir=<new folder>")
    prefix = atomic.temp_name(parent, name, "tmp")
    atomic.remove_dead_temps(parent, prefix)  # a killed run's drawing
    staging = os.path.join(parent, prefix + str(os.getpid()))
    try:
        _draw_pathfinder(staging, size, n_images, seed, per_folder, workers)
        with atomic.signals_held():  # (an interrupt now waits for the name)
            os.rename(staging, root)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError) and str(e.filename or "").startswith(staging):  # (the set meant, not its drawing)
            raise OSError(e.errno, e.strerror, root) from e
        raise
    return root


def _draw_pathfinder(root, size, n_images, seed, per_folder, workers):
    """Every image and metadata file of write_pathfinder's set, under root."""
    labels = _pathfinder_labels(n_images, seed)
    style = PATHFINDER_STYLES[size]
    jobs, metadata = [], {}
    for k in range(0, (n_images + per_folder - 1) // per_folder):
        os.makedirs(os.path.join(root, "imgs", str(k)), exist_ok=True)
        lines, items = [], []
        for j in range(min(per_folder, n_images - k * per_folder)):
            index = k * per_folder + j
            items.append((index, labels[index], os.path.join("imgs", str(k), f"sample_{j}.png")))
            # fields 0, 1, 3 are what loaders read; the rest describe the settings
            lines.append(f"imgs/{k} sample_{j}.png {j} {labels[index]} {style.n_dashes} {style.dash_len:g} "
                         f"{style.n_distractors}\n")
        metadata[os.path.join(root, "metadata", f"{k}.npy")] = lines
        jobs += [(root, size, seed, items[i:i + 100]) for i in range(0, len(items), 100)]
    with tqdm(total=n_images, desc=f"pathfinder{size} images", unit="img", disable=None) as bar:  # (a terminal's)
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                for done in pool.map(_write_pathfinder_images, jobs):
                    bar.update(done)
        else:
            for job in jobs:
                bar.update(_write_pathfinder_images(job))
    atomic.write_together({path: "".join(lines) for path, lines in metadata.items()})  # all metadata files or none


# -----------------------------------------------------------------------------
# command line (nanoGPT-style settings: python lra/generate.py --key=value ...)

task = "listops"  # "listops" | "pathfinder"
out_dir = "data/lra_gen"
seed = 0
# ListOps (defaults are LRA's)
n_train = 96000
n_val = 2000
n_test = 2000
min_len = 500  # tokens per sequence: more than min_len ...
max_len = 2000  # ... and fewer than max_len (LRA's length, 2000, is the most lra/train.py reads)
max_depth = 10
max_args = 10
parens = True
# Pathfinder
size = 32  # 32 (Pathfinder) or 128 (Path-X)
n_images = 20000  # at least 10: lra/data.py cuts them 80/10/10 into train/val/test
per_folder = 1000
workers = 0  # processes drawing Pathfinder images (0: one per core this process may use)
# -----------------------------------------------------------------------------
DEFAULTS = {k: v for k, v in cli.config_defaults(globals()).items() if k.islower()}  # not the constants above
LISTOPS_LONGEST = TASKS["listops"].seq_len  # lra/data.py reads ListOps sequences of up to this many tokens


def longest_listops(max_depth, max_args):
    """Tokens of the largest tree the grammar allows (every node an operator with max_args
    children down to max_depth), capped at 10**9."""
    longest = 1  # a digit
    for _ in range(max_depth - 1):
        longest = min(2 + max_args * longest, 10**9)
    return longest


def check_settings(cfg):
    """Every count and size, checked before anything is written."""
    cli.check(cfg, at_least_1=("n_train", "n_val", "n_test", "max_depth", "max_len", "max_args", "n_images",
                             "per_folder"),
              non_negative=("min_len",), seed=("seed",), workers=("workers",),
              choices={"task": ("listops", "pathfinder"), "size": (32, 128)})
    cli.require(cfg.out_dir, "out_dir must not be empty")
    top = os.path.abspath(cfg.out_dir)  # the part of out_dir that exists must be a folder
    while not os.path.exists(top):
        top = os.path.dirname(top)
    cli.require(os.path.isdir(top), f"out_dir {cfg.out_dir!r}: {top} is a file, not a folder: choose another --out_dir")
    if cfg.task == "listops":
        cli.require(cfg.max_args >= 2,
                    f"max_args must be at least 2 (an operator takes 2..max_args), got {cfg.max_args}")
        cli.require(cfg.max_len <= LISTOPS_LONGEST + 1, f"max_len must be at most {LISTOPS_LONGEST + 1}: lra/data.py "
                    f"reads ListOps sequences of up to {LISTOPS_LONGEST} tokens, got {cfg.max_len}")
        longest = longest_listops(cfg.max_depth, cfg.max_args)  # a tree is 1 digit, or 4..longest tokens
        fits = lambda lo, hi: max(lo, cfg.min_len + 1) <= min(hi, cfg.max_len - 1)  # noqa: E731 (lengths in range)
        cli.require(fits(1, 1) or fits(4, longest), f"no ListOps tree has more than min_len ({cfg.min_len}) and fewer "
                    f"than max_len ({cfg.max_len}) tokens: with max_depth={cfg.max_depth} and "
                    f"max_args={cfg.max_args} a tree is one digit or has 4 to {longest} tokens; change --min_len / --max_len or raise "
                    "--max_depth / --max_args")
        n = cfg.n_train + cfg.n_val + cfg.n_test
        fix = " and ".join((["--max_depth above 1"] if longest == 1 else [])
                           + (["--max_len above 4"] if cfg.max_len <= 4 else []))  # an operator needs 4 tokens
        cli.require(fits(4, longest) or n <= 10, f"only single digits fit these settings (max_depth={cfg.max_depth}, "
                    f"max_len={cfg.max_len}): 10 distinct examples, not {n}; raise {fix}")
    else:
        cli.require(cfg.n_images >= 10, f"n_images must be at least 10 (lra/data.py cuts them 80/10/10 into "
                    f"train/val/test), got {cfg.n_images}")


def existing_set(cfg):
    """The task's folder in out_dir when it already holds a set (what the loaders read), else None."""
    if cfg.task == "listops":
        folder = os.path.join(cfg.out_dir, "listops-1000")
        found = [n for n in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")
                 if os.path.exists(os.path.join(folder, n))]
    else:
        folder = os.path.join(cfg.out_dir, f"pathfinder{cfg.size}", "curv_contour_length_14")
        meta = os.path.join(folder, "metadata")
        found = [n for n in os.listdir(meta) if n.endswith(".npy")] if os.path.isdir(meta) else []
    return folder if found else None


def main(argv):
    cfg, _ = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    # one writer at a time, before the existing set is looked for
    outputs.claim_output(cfg.out_dir, "--out_dir=<new folder>")
    folder = existing_set(cfg)
    if folder:  # never overwrite a set (it may be the release's own)
        raise cli.UserError(f"{folder} already holds a {cfg.task} set: write this one elsewhere with "
                            "--out_dir=<new folder>, or delete that folder first")
    if cfg.task == "listops":
        folder = write_listops(cfg.out_dir, cfg.n_train, cfg.n_val, cfg.n_test, seed=cfg.seed, min_len=cfg.min_len,
                               max_len=cfg.max_len, max_depth=cfg.max_depth, max_args=cfg.max_args, parens=cfg.parens)
    else:
        folder = write_pathfinder(cfg.out_dir, cfg.size, cfg.n_images, cfg.seed, cfg.per_folder,
                                  cfg.workers or devices.cpu_cores())
    print(f"wrote {folder}; train with --data_dir={cfg.out_dir}")
    return folder


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
