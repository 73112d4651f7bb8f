"""
Long Range Arena data: the five tasks (plus Path-X) read from the official release layout
or through Hugging Face `datasets`, tokenised the LRA way, held in memory as ragged arrays,
and cut into padded batches with a mask of the real tokens.

    task        source                                                    length  classes
    listops     <data_dir>/listops-1000/basic_{train,val,test}.tsv        2000    10
    text        IMDB via HF datasets (stanfordnlp/imdb), bytes            4096    2
    retrieval   <data_dir>/tsv_data/new_aan_pairs.{train,eval,test}.tsv   4000 x2 2
    image       CIFAR-10 via HF datasets (uoft-cs/cifar10), grey pixels   1024    10
    pathfinder  <data_dir>/pathfinder32/curv_contour_length_14/           1024    2
    pathx       <data_dir>/pathfinder128/curv_contour_length_14/          16384   2

<data_dir> is the unpacked LRA release (default data/lra_release): download lra_release.gz
(linked from https://github.com/google-research/long-range-arena; the file is
https://storage.googleapis.com/long-range-arena/lra_release.gz, about 7 GB) and unpack it
with `mkdir -p data && tar -xzf lra_release.gz -C data` (it unpacks to data/lra_release/).
lra/generate.py writes ListOps and Pathfinder in the same layout without the download.

Splits follow LRA: ListOps and Retrieval ship train/val/test (Retrieval's val file is
"eval"); Text has no validation split, so val is IMDB's test split, as in LRA; Image
validates on the last 10% of CIFAR-10's train split; Pathfinder's images are read in
metadata order (files 0, 1, 2, ...) and cut 80/10/10 into train/val/test.

Tokens: 0 is padding everywhere. Bytes and pixels are value + 1 (vocabulary 257);
ListOps uses LISTOPS_VOCAB (vocabulary 16).

Damaged input (an empty file, bytes that are not UTF-8, a malformed line, a label outside the
task's classes, a missing or unreadable image) is a DataError of one line naming the file and
line, and what to do. With cache_dir, the tokenised arrays are kept as .npz files written
atomically; a cache file that does not load is said and rebuilt.

    python lra/summary.py --task=listops --data_dir=data/lra_gen   # load and print a summary
"""

import hashlib
import io
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from PIL import Image

from nanotost.atomic import atomic_write
from nanotost.cli import UserError
from nanotost.devices import hub_reachable
from nanotost.vit_data import eight_bit

RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
RELEASE_PAGE = "https://github.com/google-research/long-range-arena"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    seq_len: int  # LRA's length per input (per document for retrieval)
    num_classes: int
    vocab_size: int
    two_tower: bool = False


LISTOPS_VOCAB = ["<pad>", "[MIN", "[MAX", "[MED", "[SM", "]"] + [str(d) for d in range(10)]
LISTOPS_IDS = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
BYTE_VOCAB = 257  # 0 = pad, byte or pixel value v -> v + 1

TASKS = {
    "listops": TaskSpec("listops", 2000, 10, len(LISTOPS_VOCAB)),
    "text": TaskSpec("text", 4096, 2, BYTE_VOCAB),
    "retrieval": TaskSpec("retrieval", 4000, 2, BYTE_VOCAB, two_tower=True),
    "image": TaskSpec("image", 1024, 10, BYTE_VOCAB),
    "pathfinder": TaskSpec("pathfinder", 1024, 2, BYTE_VOCAB),
    "pathx": TaskSpec("pathx", 16384, 2, BYTE_VOCAB),
}
SPLITS = ("train", "val", "test")


class DataError(UserError, ValueError):
    """Data that cannot be used as it is (missing, empty, a label out of range): one line from
    lra/train.py (cli.run_cli)."""


class DamagedData(DataError):
    """A malformed file of a task: load_split adds how to get the file again."""


def get_task(name):
    if name not in TASKS:
        raise DataError(f"unknown LRA task {name!r}; choose from {', '.join(TASKS)}")
    return TASKS[name]


# -----------------------------------------------------------------------------
# in-memory storage


@dataclass
class Ragged:
    """Variable-length sequences in one flat array: sequence i is
    values[offsets[i]:offsets[i + 1]] + shift (bytes are stored raw, shifted to tokens late)."""

    values: np.ndarray  # (total,) uint8
    offsets: np.ndarray  # (N + 1,) int64
    shift: int = 0

    @classmethod
    def from_list(cls, seqs, shift=0):
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([np.asarray(s, dtype=np.uint8) for s in seqs]) if seqs else np.zeros(0, np.uint8)
        return cls(values, offsets, shift)

    def __len__(self):
        return len(self.offsets) - 1

    def lengths(self):
        return np.diff(self.offsets)

    def __getitem__(self, i):  # token ids of sequence i, int64
        return self.values[self.offsets[i]:self.offsets[i + 1]].astype(np.int64) + self.shift

    def crop(self, max_len):
        """(this Ragged with every sequence cut to max_len, (N,) bool: which were longer)."""
        lengths = self.lengths()
        kept = np.minimum(lengths, max_len)
        if (kept == lengths).all():
            return self, np.zeros(len(self), bool)
        position = np.arange(len(self.values)) - np.repeat(self.offsets[:-1], lengths)  # index within its sequence
        offsets = np.zeros_like(self.offsets)
        np.cumsum(kept, out=offsets[1:])
        return Ragged(self.values[position < np.repeat(kept, lengths)], offsets, self.shift), lengths > max_len


@dataclass
class Split:
    """One split of a task: one Ragged per tower (two for retrieval) and the labels."""

    inputs: tuple
    labels: np.ndarray  # (N,) int64
    was_cropped: np.ndarray = None  # (N,) bool: examples load_split cut to a max_len shorter than the task's

    @property
    def cropped(self):
        """How many examples were cropped to max_len."""
        return 0 if self.was_cropped is None else int(self.was_cropped.sum())

    def __len__(self):
        return len(self.labels)

    def subset(self, n):
        """The first n examples (n <= 0: all)."""
        if n <= 0 or n >= len(self):
            return self
        return Split(tuple(Ragged(r.values[:r.offsets[n]], r.offsets[:n + 1], r.shift) for r in self.inputs),
                     self.labels[:n], None if self.was_cropped is None else self.was_cropped[:n])


def make_batch(split, idx, max_len, pad_multiple=1):
    """Padded batch of examples idx. Returns ([(tokens (B, T) int64, mask (B, T) bool) per
    tower], labels (B,) int64). T is the longest sequence in the batch, cropped to max_len,
    rounded up to pad_multiple (never above max_len): padding beyond real tokens is masked."""
    towers = []
    for ragged in split.inputs:
        seqs = [ragged[i][:max_len] for i in idx]
        T = max(len(s) for s in seqs)
        T = min(max_len, -(-T // pad_multiple) * pad_multiple)
        tokens = np.zeros((len(seqs), T), dtype=np.int64)
        for row, s in enumerate(seqs):
            tokens[row, :len(s)] = s
        mask = np.arange(T)[None, :] < np.array([len(s) for s in seqs])[:, None]
        towers.append((torch.from_numpy(tokens), torch.from_numpy(mask)))
    return towers, torch.from_numpy(split.labels[idx])


# -----------------------------------------------------------------------------
# errors


def _missing(task, path, data_dir):
    if task in ("listops", "pathfinder"):
        gen = (f" Or generate it without the download, for --data_dir=data/lra_gen: python lra/generate.py "
               f"--task={task} --out_dir=data/lra_gen{' --size=32' if task == 'pathfinder' else ''}")
    elif task == "pathx":
        gen = " Or generate it: python lra/generate.py --task=pathfinder --size=128 --out_dir=data/lra_gen."
    else:
        gen = ""
    return DataError(
        f"LRA {task} data not found: expected {path}. Download the LRA release archive lra_release.gz "
        f"(linked from {RELEASE_PAGE}: {RELEASE_URL}) and unpack it with "
        f"`mkdir -p data && tar -xzf lra_release.gz -C data`, which gives data/lra_release/; "
        f"set --data_dir to that folder (data_dir is now {data_dir!r}).{gen}")


def _how_to_replace(task):
    """What to do about a damaged file of `task`: get it again."""
    if task in ("listops", "pathfinder", "pathx"):
        what = "listops" if task == "listops" else f"pathfinder --size={32 if task == 'pathfinder' else 128}"
        return (f"unpack lra_release.gz again, or generate the task anew for --data_dir=<new folder>: "
                f"python lra/generate.py --task={what} --out_dir=<new folder>")
    if task == "retrieval":
        return "unpack lra_release.gz again"
    return f"check the dataset --hf_{task} names (a Hub name, or a folder of parquet files)"


# -----------------------------------------------------------------------------
# readers, one per layout


def _lines(path):
    """(line number, text) of each non-empty line of a UTF-8 text file (\\n or \\r\\n ends);
    bytes that are not UTF-8 are a DamagedData naming the file and line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError as e:
                raise DamagedData(f"{path}:{n}: not UTF-8 text (byte {e.start} of the line)") from None
            if line:
                yield n, line


def listops_tokens(source):
    """Release text -> token ids: parentheses dropped, whitespace split, LISTOPS_VOCAB ids."""
    words = source.replace("(", " ").replace(")", " ").split()
    try:
        return [LISTOPS_IDS[w] for w in words]
    except KeyError as e:
        raise DamagedData(f"unknown ListOps token {e.args[0]!r} (known: {' '.join(LISTOPS_VOCAB[1:])})") from None


def _label(text, where, num_classes):
    """A label field as an int in 0..num_classes-1, or a DamagedData naming file and line."""
    try:
        value = float(text)
        if value != int(value):
            raise ValueError
    except (ValueError, OverflowError):
        raise DamagedData(f"{where}: the label {text[:40]!r} is not an integer") from None
    if not 0 <= value < num_classes:
        raise DamagedData(f"{where}: label {int(value)} is out of range: this task has classes 0..{num_classes - 1}")
    return int(value)


def read_listops(data_dir, split, max_len):
    path = os.path.join(data_dir, "listops-1000", f"basic_{split}.tsv")
    if not os.path.isfile(path):
        raise _missing("listops", path, data_dir)
    seqs, labels, header = [], [], None
    for n, line in _lines(path):
        if header is None:
            header = line.split("\t")
            if header[:2] != ["Source", "Target"] or n != 1:
                raise DamagedData(f"{path}:{n}: expected a 'Source<TAB>Target' header, got {line[:80]!r}")
            continue
        source, _, target = line.rpartition("\t")
        if not source:
            raise DamagedData(f"{path}:{n}: expected 'Source<TAB>Target', got {line[:80]!r}")
        try:
            tokens = listops_tokens(source)
        except DamagedData as e:
            raise DamagedData(f"{path}:{n}: {e}") from None
        if not tokens:
            raise DamagedData(f"{path}:{n}: the source {source[:80]!r} has no ListOps tokens")
        seqs.append(tokens[:max_len])
        labels.append(_label(target, f"{path}:{n}", TASKS["listops"].num_classes))
    if not seqs:
        raise DamagedData(f"{path} is empty" if header is None else f"{path} has a header but no examples")
    return Split((Ragged.from_list(seqs),), np.array(labels, dtype=np.int64))


def _utf8(text, max_len):
    return np.frombuffer(text.encode("utf-8")[:max_len], dtype=np.uint8)


def read_retrieval(data_dir, split, max_len):
    name = {"train": "train", "val": "eval", "test": "test"}[split]
    path = os.path.join(data_dir, "tsv_data", f"new_aan_pairs.{name}.tsv")
    if not os.path.isfile(path):
        raise _missing("retrieval", path, data_dir)
    docs1, docs2, labels = [], [], []
    for n, line in _lines(path):
        fields = line.split("\t")
        if len(fields) != 5:
            raise DamagedData(f"{path}:{n}: expected 5 tab-separated fields (label, id1, id2, text1, text2), "
                              f"got {len(fields)}")
        labels.append(_label(fields[0], f"{path}:{n}", TASKS["retrieval"].num_classes))
        docs1.append(_utf8(fields[3], max_len))
        docs2.append(_utf8(fields[4], max_len))
    if not labels:
        raise DamagedData(f"{path} is empty")
    return Split((Ragged.from_list(docs1, shift=1), Ragged.from_list(docs2, shift=1)),
                 np.array(labels, dtype=np.int64))


def _hf_split(name, split, what):
    """A split of a Hugging Face dataset, by hub name or local folder, with a clear error."""
    online = os.path.isdir(name) or hub_reachable()  # offline: the cache or nothing, at once (no ~25 s of retries)
    try:
        import datasets

        return datasets.load_dataset(name, split=split)
    except Exception as e:  # no network, not cached, bad name: all end here
        if isinstance(e, OSError) and e.filename:  # the cache's folder cannot be written: run_cli names it
            raise
        first = (str(e).strip().splitlines() or [""])[0][:200]  # one line
        first += "" if online else " (offline: the Hub was not reached)"
        raise DataError(
            f"could not load {what} ({name!r}, split {split!r}) through Hugging Face datasets: "
            f"{type(e).__name__}: {first}. It downloads on first use, which needs internet; on an offline machine "
            f"run once where there is internet: python -c \"import datasets; datasets.load_dataset('{name}')\" "
            f"and copy ~/.cache/huggingface over (or set HF_HOME to such a copy), or point the setting at a local "
            f"folder of parquet files "
            f"(train-*.parquet / test-*.parquet).") from e


def read_text(hf_name, split, max_len):
    ds = _hf_split(hf_name, "train" if split == "train" else "test", "IMDB")
    docs = [_utf8(t, max_len) for t in ds["text"]]
    return Split((Ragged.from_list(docs, shift=1),), np.asarray(list(ds["label"]), dtype=np.int64))


def _grey_pixels(item):
    """(name, PNG bytes) -> flat uint8 grey pixels, through Pillow (RGB -> ITU-R 601 luma, alpha
    dropped; 16-bit grey scaled, never clipped: vit_data.eight_bit); bytes that are no image
    are a DamagedData naming the image."""
    name, png_bytes = item
    try:
        with Image.open(io.BytesIO(png_bytes)) as im:
            im = eight_bit(im)
            return np.asarray(im if im.mode == "L" else im.convert("RGB").convert("L")).reshape(-1)  # (LAB: no L)
    except (OSError, SyntaxError, ValueError) as e:  # PIL: UnidentifiedImageError, truncated data, ...
        raise DamagedData(f"{name} is not a readable image ({type(e).__name__}: {str(e)[:80]})") from None


def _decode_all(items, workers):
    """_grey_pixels of each (name, bytes), in worker processes for many images."""
    if workers > 1 and len(items) > 2000:
        with ProcessPoolExecutor(workers) as pool:
            return list(pool.map(_grey_pixels, items, chunksize=256))
    return [_grey_pixels(item) for item in items]


def read_image(hf_name, split, max_len, workers=1):
    import datasets

    ds = _hf_split(hf_name, "test" if split == "test" else "train", "CIFAR-10")
    column = "img" if "img" in ds.column_names else "image"
    ds = ds.cast_column(column, datasets.Image(decode=False))  # raw PNG bytes, decoded by Pillow below
    if split != "test":  # LRA: validate on the last 10% of the train split
        cut = int(0.9 * len(ds))
        ds = ds.select(range(cut) if split == "train" else range(cut, len(ds)))
    items = [(f"{hf_name} ({split}) image {i}", im["bytes"]) for i, im in enumerate(ds[column])]
    pixels = _decode_all(items, workers)
    return Split((Ragged.from_list([p[:max_len] for p in pixels], shift=1),),
                 np.asarray(list(ds["label"]), dtype=np.int64))


def _pathfinder_root(data_dir, task):
    size = 32 if task == "pathfinder" else 128
    return os.path.join(data_dir, f"pathfinder{size}", "curv_contour_length_14")


def read_pathfinder(data_dir, split, max_len, task="pathfinder", workers=1):
    root = _pathfinder_root(data_dir, task)
    meta_dir = os.path.join(root, "metadata")
    if not os.path.isdir(meta_dir):
        raise _missing(task, meta_dir, data_dir)
    files = sorted((f for f in os.listdir(meta_dir) if f.endswith(".npy")), key=lambda f: (len(f), f))
    entries = []  # (image path, label, metadata file:line) in metadata order
    for name in files:
        path = os.path.join(meta_dir, name)
        for n, line in _lines(path):  # text, despite the .npy name
            fields = line.split()
            if len(fields) < 4:
                raise DamagedData(f"{path}:{n}: expected 'folder file index label ...', got {line[:80]!r}")
            entries.append((os.path.join(root, fields[0], fields[1]), _label(fields[3], f"{path}:{n}", 2),
                            f"{path}:{n}"))
    if not entries:
        raise _missing(task, os.path.join(meta_dir, "0.npy"), data_dir)
    n = len(entries)
    lo, hi = {"train": (0, int(0.8 * n)), "val": (int(0.8 * n), int(0.9 * n)), "test": (int(0.9 * n), n)}[split]
    if hi <= lo:
        raise DamagedData(f"{meta_dir} lists {n} images, too few for a {split} split (80/10/10 of them): "
                          f"it needs at least 10")
    entries = entries[lo:hi]
    items = []
    for path, _, where in entries:
        if not os.path.isfile(path):
            raise DamagedData(f"{where}: names the image {path}, which is missing")
        with open(path, "rb") as f:
            items.append((path, f.read()))
    pixels = _decode_all(items, workers)
    side = 32 if task == "pathfinder" else 128
    for (path, _), p in zip(items, pixels):
        if len(p) != side * side:
            raise DamagedData(f"{path} has {len(p)} pixels, not {side} x {side}")
    return Split((Ragged.from_list([p[:max_len] for p in pixels], shift=1),),
                 np.array([label for _, label, _ in entries], dtype=np.int64))


# -----------------------------------------------------------------------------
# entry point with an optional on-disk cache


def _source_stamp(task, data_dir, hf_text, hf_image):
    """What the cached arrays were made from: paths, and sizes + mtimes of release files."""
    if task == "text":
        return f"hf:{hf_text}"
    if task == "image":
        return f"hf:{hf_image}"
    folder = {"listops": os.path.join(data_dir, "listops-1000"), "retrieval": os.path.join(data_dir, "tsv_data")}.get(
        task) or os.path.join(_pathfinder_root(data_dir, task), "metadata")
    stamp = os.path.abspath(folder)
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            st = os.stat(os.path.join(folder, name))
            stamp += f"|{name}:{st.st_size}:{st.st_mtime_ns}"
    return stamp


def _read_cache(path, say):
    """The Split kept in the cache file `path`; None when there is none, or when it does not
    load or its arrays disagree (said: the caller rebuilds it)."""
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path) as z:
            towers = tuple(Ragged(z[f"values{i}"], z[f"offsets{i}"], int(z[f"shift{i}"]))
                           for i in range(int(z["towers"])))
            split = Split(towers, z["labels"], z["was_cropped"])
        if not towers or not all(r.offsets[-1] == len(r.values) and len(r) == len(split) for r in towers) \
                or split.was_cropped.shape != split.labels.shape:
            raise ValueError("arrays of different lengths")
        return split
    except Exception as e:  # zip errors, missing arrays, pickled data, truncation: a damaged file
        say(f"the cache file {path} is damaged ({type(e).__name__}: {str(e)[:80]}); rebuilding it")
        return None


def _is_cache(path):
    """Whether path holds a cache file that loads (a symlink in the cache folder is written through only to one)."""
    return _read_cache(path, lambda line: None) is not None


def _write_cache(path, data):
    arrays = {"labels": data.labels, "towers": len(data.inputs), "was_cropped": data.was_cropped}
    for i, r in enumerate(data.inputs):
        arrays.update({f"values{i}": r.values, f"offsets{i}": r.offsets, f"shift{i}": r.shift})
    with atomic_write(path, own=_is_cache) as f:  # all or nothing: a killed run leaves no half-written cache
        np.savez(f, **arrays)


def load_split(task, split, data_dir="data/lra_release", max_len=None, cache_dir="", hf_text="stanfordnlp/imdb",
               hf_image="uoft-cs/cifar10", workers=1, say=print):
    """One split ("train" | "val" | "test") of an LRA task as a Split. Sequences are read at the
    task's LRA length, then cut to max_len (default: that length); Split.cropped says how many
    were longer. Damaged files, an empty split and labels out of the task's range are a
    DataError. With cache_dir, the tokenised arrays are kept there as .npz."""
    spec = get_task(task)
    if split not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {split!r}")
    max_len = min(max_len or spec.seq_len, spec.seq_len)
    cache = None
    if cache_dir:
        key = hashlib.sha1(f"v2|{task}|{split}|{max_len}|{_source_stamp(task, data_dir, hf_text, hf_image)}".encode())
        cache = os.path.join(cache_dir, f"{task}-{split}-{max_len}-{key.hexdigest()[:12]}.npz")
        kept = _read_cache(cache, say)
        if kept is not None:
            return kept
    try:
        if task == "listops":
            data = read_listops(data_dir, split, spec.seq_len)
        elif task == "retrieval":
            data = read_retrieval(data_dir, split, spec.seq_len)
        elif task == "text":
            data = read_text(hf_text, split, spec.seq_len)
        elif task == "image":
            data = read_image(hf_image, split, spec.seq_len, workers)
        else:
            data = read_pathfinder(data_dir, split, spec.seq_len, task, workers)
    except DamagedData as e:
        raise DamagedData(f"{e}: {_how_to_replace(task)}") from None
    bad = (data.labels < 0) | (data.labels >= spec.num_classes)
    if bad.any():
        raise DataError(f"LRA {task} {split}: {int(bad.sum())} labels are out of range (first: example "
                        f"{int(np.argmax(bad))}, label {int(data.labels[bad][0])}); this task has classes "
                        f"0..{spec.num_classes - 1}: {_how_to_replace(task)}")
    if len(data) == 0:
        raise DataError(f"LRA {task} {split} has no examples: {_how_to_replace(task)}")
    crops = [r.crop(max_len) for r in data.inputs]  # per tower: (cropped Ragged, which were longer)
    data = Split(tuple(r for r, _ in crops), data.labels, np.logical_or.reduce([c for _, c in crops]))
    if cache:
        _write_cache(cache, data)
    return data
