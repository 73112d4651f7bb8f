"""
Tests for lra/: generators (deterministic, valid labels checked independently), loaders for
all five release layouts (files written here, PNGs through Pillow), padding masks through the
whole encoder, parameter budgets of the configs, learning on tiny ListOps, exact resume.

    python -m pytest -q lra/test_lra.py     (CPU, offline, ~10-45 s)
"""

import io
import json
import os
import statistics
import sys

os.environ["HF_DATASETS_OFFLINE"] = "1"  # never reach for the network
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import background  # noqa: E402  (the session's scratch: removed however the session ends)

os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(background.SCRATCH, "lra_hf"))

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lra import generate, train
from lra.data import LISTOPS_VOCAB, load_split, make_batch
from lra.encoder import LRAClassifier, LRAConfig
from nanotost import checkpoints, cli
from PIL import Image

torch.set_num_threads(1)  # on a shared 2-core machine more threads only contend
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -----------------------------------------------------------------------------
# an independent ListOps evaluator: reads the text, not the generator's trees


def evaluate_listops(text):
    """(value, max depth of any node, [argument counts], token count) of a release line."""
    tokens = text.replace("(", " ").replace(")", " ").split()
    pos = 0

    def node(depth):
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok.isdigit():
            return int(tok), depth, []
        args, deepest, counts = [], depth, []
        while tokens[pos] != "]":
            value, d, c = node(depth + 1)
            args.append(value)
            deepest, counts = max(deepest, d), counts + c
        pos += 1  # the "]"
        value = {"[MIN": min, "[MAX": max, "[MED": lambda a: int(statistics.median(a)),
                 "[SM": lambda a: sum(a) % 10}[tok](args)
        return value, deepest, counts + [len(args)]

    value, depth, counts = node(1)
    assert pos == len(tokens), "trailing tokens after the expression"
    return value, depth, counts, len(tokens)


def read_tsv(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "Source\tTarget"
    return [(src, int(tgt)) for src, tgt in (line.split("\t") for line in lines[1:])]


def test_listops_generator_is_seeded_and_labels_are_right(tmp_path):
    kw = dict(n_train=60, n_val=20, n_test=20, min_len=10, max_len=60, max_depth=3, max_args=5)
    folder = generate.write_listops(tmp_path / "a", seed=1, **kw)
    again = generate.write_listops(tmp_path / "b", seed=1, **kw)
    other = generate.write_listops(tmp_path / "c", seed=2, **kw)
    rows = []
    for split in ("train", "val", "test"):
        text = open(os.path.join(folder, f"basic_{split}.tsv")).read()
        assert text == open(os.path.join(again, f"basic_{split}.tsv")).read()  # same seed, same bytes
        rows += read_tsv(os.path.join(folder, f"basic_{split}.tsv"))
    assert read_tsv(os.path.join(other, "basic_train.tsv")) != read_tsv(os.path.join(folder, "basic_train.tsv"))
    assert len(rows) == 100 and len({src for src, _ in rows}) == 100  # de-duplicated across splits
    ops_seen = set()
    for src, label in rows:
        value, depth, counts, length = evaluate_listops(src)
        assert value == label
        assert 10 < length < 60 and depth <= 3 and all(2 <= c <= 5 for c in counts)
        # the release's pairwise bracketing: an operator with k arguments opens k + 1 parentheses
        assert src.count("(") == src.count(")") == sum(c + 1 for c in counts)
        ops_seen |= {t for t in src.split() if t.startswith("[")}
    assert ops_seen == {"[MIN", "[MAX", "[MED", "[SM"}
    # LRA's own sizes: lengths 500-2000, depth <= 10, up to 10 arguments
    for src, label in generate.generate_listops(5, seed=0):
        value, depth, counts, length = evaluate_listops(src)
        assert value == label and 500 < length < 2000 and depth <= 10 and max(counts) <= 10


# -----------------------------------------------------------------------------
# Pathfinder


def components(mask):
    """8-connected component label per pixel (-1 for background), by flood fill."""
    H, W = mask.shape
    label = -np.ones((H, W), int)
    n = 0
    for y, x in zip(*np.nonzero(mask)):
        if label[y, x] >= 0:
            continue
        stack, label[y, x] = [(y, x)], n
        while stack:
            cy, cx = stack.pop()
            for ny in range(max(cy - 1, 0), min(cy + 2, H)):
                for nx in range(max(cx - 1, 0), min(cx + 2, W)):
                    if mask[ny, nx] and label[ny, nx] < 0:
                        label[ny, nx] = n
                        stack.append((ny, nx))
        n += 1
    return label


def dilate(mask):  # 3 x 3 maximum
    padded = np.pad(mask, 1)
    H, W = mask.shape
    return np.any([padded[dy:dy + H, dx:dx + W] for dy in range(3) for dx in range(3)], axis=0)


def markers_connected(img, markers, bridge_gaps):
    """Whether the two markers lie in one connected stroke of the picture: ink above a
    quarter grey, dash gaps bridged by a 3 x 3 dilation where they are wider than a pixel."""
    ink = img > 64
    label = components(dilate(ink) if bridge_gaps else ink)
    (x0, y0), (x1, y1) = markers
    a, b = label[int(y0), int(x0)], label[int(y1), int(x1)]
    return a >= 0 and a == b


def least_distance(path_a, path_b):
    """Least distance between two paths' dashes ((n, 2, 2) segments), sampled every 0.1 px."""
    def sample(path):
        t = np.linspace(0, 1, 30)[:, None]
        return np.concatenate([a + t * (b - a) for a, b in path])
    pa, pb = sample(path_a), sample(path_b)
    return np.sqrt(((pa[:, None] - pb[None]) ** 2).sum(-1).min())


def check_scene(img, scene, style, bridge_gaps):
    assert len(scene.paths) >= 2 and all(len(p) == style.n_dashes for p in scene.paths[:2])
    for i in range(len(scene.paths)):  # no two paths touch
        for j in range(i + 1, len(scene.paths)):
            assert least_distance(scene.paths[i], scene.paths[j]) >= style.clearance - 0.05
    ends = [tuple(scene.paths[k][0, 0]) for k in (0, 1)] + [tuple(scene.paths[k][-1, 1]) for k in (0, 1)]
    assert all(tuple(m) in ends for m in scene.markers)  # markers sit on ends of the long paths
    for marker, own in zip(scene.markers, scene.marker_paths):  # and stay clear of every other path
        for k, path in enumerate(scene.paths):
            if k != own:
                gap = least_distance(path, np.array([[marker, marker]]))
                assert gap >= style.clearance + style.marker_radius - 0.05
    assert (scene.marker_paths[0] == scene.marker_paths[1]) == (scene.label == 1)
    # the label read back from the pixels alone
    assert markers_connected(img, scene.markers, bridge_gaps) == (scene.label == 1)


def test_pathfinder_generator_layout_determinism_and_labels(tmp_path):
    root = generate.write_pathfinder(tmp_path / "a", size=32, n_images=12, seed=3, per_folder=5)
    again = generate.write_pathfinder(tmp_path / "b", size=32, n_images=12, seed=3, per_folder=5)
    other = generate.write_pathfinder(tmp_path / "c", size=32, n_images=12, seed=4, per_folder=5)
    assert sorted(os.listdir(os.path.join(root, "metadata"))) == ["0.npy", "1.npy", "2.npy"]
    lines = [line.split() for k in range(3) for line in open(os.path.join(root, "metadata", f"{k}.npy"))]
    assert len(lines) == 12 and sum(int(f[3]) for f in lines) == 6  # balanced labels
    style = generate.PATHFINDER_STYLES[32]
    differs = False
    for index, fields in enumerate(lines):
        rel = os.path.join(fields[0], fields[1])
        data = open(os.path.join(root, rel), "rb").read()
        assert data == open(os.path.join(again, rel), "rb").read()
        differs |= data != open(os.path.join(other, rel), "rb").read()
        img = decode_png(data)
        redo, scene = generate.pathfinder_sample(np.random.default_rng([3, index]), style, int(fields[3]))
        assert np.array_equal(img, redo) and img.shape == (32, 32)
        check_scene(img, scene, style, bridge_gaps=False)
    assert differs
    # a long path's ends (where markers go) keep clearance + marker radius from other paths:
    # grow long paths next to a wall of ink
    wall = np.stack([np.linspace(0, 20, 120), np.full(120, 12.0)], axis=1)
    rng, grown = np.random.default_rng(0), 0
    for _ in range(40):
        path = generate._grow_path(rng, style, style.n_dashes, wall, np.zeros((0, 2)), rim=2.5, marked=True)
        if path is not None:
            grown += 1
            tips = path[0][[0, -1], [0, 1]]  # (2, 2) first and last point
            assert np.sqrt(((tips[:, None] - wall[None]) ** 2).sum(-1)).min() >= style.clearance + style.marker_radius
    assert grown >= 10
    style = generate.PATHFINDER_STYLES[128]
    for label in (0, 1):  # Path-X size
        img, scene = generate.pathfinder_sample(np.random.default_rng([7, label]), style, label)
        assert img.shape == (128, 128)
        check_scene(img, scene, style, bridge_gaps=True)


# -----------------------------------------------------------------------------
# PNG (Pillow)


def encode_png(pixels):
    """PNG bytes of uint8 (H, W) grey or (H, W, 3) RGB pixels, written by Pillow."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def decode_png(data):
    return np.asarray(Image.open(io.BytesIO(data)))


# -----------------------------------------------------------------------------
# loaders: the five layouts, written here


def test_listops_loader_reads_release_tsv_and_batches(tmp_path):
    folder = tmp_path / "listops-1000"
    folder.mkdir()
    lines = ["( ( ( [MAX 4 ) 3 ) ] )\t4", "( ( ( ( [SM 9 ) 8 ) ( ( ( [MIN 2 ) 7 ) ] ) ) ] )\t9"]
    for split in ("train", "val", "test"):  # csv.writer's \r\n line ends, as in the release
        (folder / f"basic_{split}.tsv").write_bytes(("Source\tTarget\r\n" + "\r\n".join(lines) + "\r\n").encode())
    data = load_split("listops", "train", data_dir=str(tmp_path))
    ids = {tok: i for i, tok in enumerate(LISTOPS_VOCAB)}
    assert data.labels.tolist() == [4, 9]
    assert data.inputs[0][0].tolist() == [ids["[MAX"], ids["4"], ids["3"], ids["]"]]
    assert data.inputs[0][1].tolist() == [ids[t] for t in "[SM 9 8 [MIN 2 7 ] ]".split()]
    (tokens, mask), = make_batch(data, [1, 0], max_len=2000, pad_multiple=4)[0]
    assert tokens.shape == (2, 8) and mask.sum(1).tolist() == [8, 4]
    assert tokens[1, 4:].tolist() == [0, 0, 0, 0] and not mask[1, 4:].any()
    (tokens, mask), = make_batch(data, [1], max_len=5, pad_multiple=4)[0]  # cropped, never past max_len
    assert tokens.shape == (1, 5) and mask.all()
    cropped = load_split("listops", "val", data_dir=str(tmp_path), max_len=3)
    assert cropped.inputs[0].lengths().tolist() == [3, 3]


def test_retrieval_loader_reads_aan_pairs(tmp_path):
    folder = tmp_path / "tsv_data"
    folder.mkdir()
    rows = ["1.0\tP01-1\tW05-2\tb'first doc'\tsecond d\u00f6c", "0\tA-1\tB-2\tx\tyy"]
    for name in ("train", "eval", "test"):
        (folder / f"new_aan_pairs.{name}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    data = load_split("retrieval", "val", data_dir=str(tmp_path), max_len=6)  # val is the "eval" file
    assert data.labels.tolist() == [1, 0] and len(data.inputs) == 2
    assert data.inputs[0][0].tolist() == [b + 1 for b in b"b'firs"]  # bytes + 1, cropped to 6
    assert data.inputs[1][0].tolist() == [b + 1 for b in "second d\u00f6c".encode()[:6]]
    towers, labels = make_batch(data, [0, 1], max_len=6)
    assert len(towers) == 2 and towers[1][1].sum(1).tolist() == [6, 2]


def _write_hf_parquet(folder, columns, features=None):
    import datasets

    folder.mkdir()
    for split in ("train", "test"):
        ds = datasets.Dataset.from_dict(columns)
        for name, feature in (features or {}).items():
            ds = ds.cast_column(name, feature)
        ds.to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))


def test_text_loader_reads_imdb_through_datasets(tmp_path):
    texts = ["a great film", "caf\u00e9 " * 3000]  # the second is longer than 4096 bytes
    _write_hf_parquet(tmp_path / "imdb", {"text": texts, "label": [1, 0]})
    data = load_split("text", "train", hf_text=str(tmp_path / "imdb"))
    assert data.labels.tolist() == [1, 0]
    assert data.inputs[0][0].tolist() == [b + 1 for b in b"a great film"]
    assert len(data.inputs[0][1]) == 4096 and data.inputs[0][1][:5].tolist() == [b + 1 for b in "caf\u00e9".encode()]


def test_image_loader_reads_cifar_png_bytes_as_grey_pixels(tmp_path):
    import datasets

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    _write_hf_parquet(tmp_path / "cifar", {"img": [{"bytes": encode_png(im), "path": None} for im in images],
                                          "label": list(range(10))},
                      {"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    train_split = load_split("image", "train", hf_image=str(tmp_path / "cifar"))
    val_split = load_split("image", "val", hf_image=str(tmp_path / "cifar"))
    assert train_split.labels.tolist() == list(range(9)) and val_split.labels.tolist() == [9]  # last 10%
    weights = np.array([0.2989, 0.5870, 0.1140])
    want = np.rint(images[9].astype(float) @ weights).astype(int).reshape(-1) + 1
    assert len(val_split.inputs[0][0]) == 1024 and np.abs(val_split.inputs[0][0] - want).max() <= 1  # float rounding


def test_pathfinder_loader_reads_release_layout(tmp_path):
    root = tmp_path / "pathfinder32" / "curv_contour_length_14"
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (20, 32, 32), dtype=np.uint8), [i % 2 for i in range(20)]
    for k in (0, 1, 10):  # metadata files read in numeric order: 0, 1, 10
        (root / "imgs" / str(k)).mkdir(parents=True)
    (root / "metadata").mkdir()
    folders = [0] * 8 + [1] * 8 + [10] * 4
    for k in (0, 1, 10):
        lines = []
        for i in [i for i in range(20) if folders[i] == k]:
            (root / "imgs" / str(k) / f"sample_{i}.png").write_bytes(encode_png(images[i]))
            lines.append(f"imgs/{k} sample_{i}.png {i} {labels[i]} 14 2 5\n")
        (root / "metadata" / f"{k}.npy").write_text("".join(lines))
    parts = {s: load_split("pathfinder", s, data_dir=str(tmp_path)) for s in ("train", "val", "test")}
    assert [len(parts[s]) for s in ("train", "val", "test")] == [16, 2, 2]  # 80 / 10 / 10
    assert parts["test"].labels.tolist() == labels[18:]
    assert np.array_equal(parts["val"].inputs[0][1], images[17].reshape(-1).astype(np.int64) + 1)


def test_missing_data_says_where_to_get_it(tmp_path):
    for task in ("listops", "retrieval", "pathfinder", "pathx"):
        with pytest.raises(cli.UserError, match="lra_release.gz") as err:  # run_cli prints it as one line
            load_split(task, "train", data_dir=str(tmp_path / "nowhere"))
        assert "tar -xzf" in str(err.value) and str(tmp_path / "nowhere") in str(err.value)
    with pytest.raises(cli.UserError, match="internet"):  # run_cli prints it as one line
        load_split("text", "train", hf_text=str(tmp_path / "no_such_dataset"))
    with pytest.raises(ValueError, match="unknown LRA task"):
        load_split("listopz", "train")


# -----------------------------------------------------------------------------
# model


def masked_tssa_numpy(w, temp, n):
    """MATH.md §3 over the first n tokens only, in float64 numpy, written from the formulas:
    w (H, T, p) of one sequence -> (out (H, n, p), Pi (H, n), second moments s (H, p))."""
    w = w[:, :n].astype(np.float64)  # padded tokens are simply not there
    sq = w ** 2
    logits = temp[:, None] * (sq / sq.sum(axis=1, keepdims=True)).sum(-1)  # (H, n)
    pi = np.exp(logits - logits.max(0)) / np.exp(logits - logits.max(0)).sum(0)  # softmax over heads
    s = (pi[..., None] * sq).sum(1) / pi.sum(1)[:, None]  # (H, p): Pi-weighted second moments
    return -pi[..., None] * w / (1.0 + s[:, None, :]), pi, s


@pytest.mark.parametrize("impl", ["torch", "cpu"])  # tssa_impl: model.py's maths, the C kernels
def test_masked_tssa_statistics_leave_padding_out(impl):
    """The operator itself (model.tssa with a mask): Pi and the second moments are those of
    the real tokens alone, whatever follows them; padded tokens get Pi = 0 and output 0, and
    no gradient flows from real outputs into padded inputs."""
    tssa = __import__("kernels").ops_for(impl).tssa

    torch.manual_seed(0)
    H, p, lengths = 3, 4, [6, 19]
    real = torch.randn(2, H, 19, p)
    temp = torch.tensor([1.0, 0.5, 2.0])
    want = [masked_tssa_numpy(real[b].numpy(), temp.numpy(), n) for b, n in enumerate(lengths)]
    for extra in (0, 7, 50):
        T = 19 + extra
        mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]  # (2, T)
        junk = 30 * torch.randn(2, H, T, p)  # large, so any leak would show
        w = torch.where(mask[:, None, :, None], torch.nn.functional.pad(real, (0, 0, 0, extra)), junk)
        w.requires_grad_(True)
        out, pi = tssa(w, temp, return_pi=True, mask=mask)
        for b, n in enumerate(lengths):
            out_np, pi_np, _ = want[b]
            np.testing.assert_allclose(out[b, :, :n].detach().numpy(), out_np, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(pi[b, :, :n].detach().numpy(), pi_np, rtol=1e-4, atol=1e-6)
            assert not out[b, :, n:].any() and not pi[b, :, n:].any()  # (empty when n == T)
        real_out = (out * mask[:, None, :, None]).sum()  # outputs at real tokens only
        (grad,) = torch.autograd.grad(real_out, w)
        pad = ~mask[:, None, :, None].expand_as(grad)  # sequence 0 is always padded
        assert not grad[pad].any() and grad[~pad].abs().max() > 0
    # control: without the mask the junk does change the statistics of the real tokens
    out_unmasked = tssa(w.detach(), temp, mask=None)
    assert (out_unmasked[0, :, :6] - torch.from_numpy(want[0][0]).float()).abs().max() > 1e-3


@pytest.mark.parametrize("attn,norm,two_tower", [("tssa", "pre", False), ("tssa", "post", False),
                                                 ("softmax", "pre", False), ("tssa", "pre", True)])
def test_padding_never_changes_real_tokens(attn, norm, two_tower):
    torch.manual_seed(0)
    model = LRAClassifier(LRAConfig(vocab_size=20, num_classes=3, max_len=128, n_layer=2, n_head=2, n_embd=32,
                                    mlp_hidden=64, dropout=0.0, attn=attn, norm=norm, two_tower=two_tower)).eval()
    lengths = torch.tensor([5, 17, 40])
    real = torch.randint(1, 20, (3, 40))

    def padded(extra, seed):  # the real tokens, then `extra` junk tokens (not even pad ids)
        junk = torch.randint(1, 20, (3, 40 + extra), generator=torch.Generator().manual_seed(seed))
        mask = torch.arange(40 + extra)[None] < lengths[:, None]
        return torch.where(mask, torch.nn.functional.pad(real, (0, extra)), junk), mask

    with torch.no_grad():
        results = []
        for extra, seed in ((0, 1), (9, 2), (80, 3)):
            tokens, mask = padded(extra, seed)
            towers = [(tokens, mask), padded(extra + 3, seed + 10)] if two_tower else [(tokens, mask)]
            feats, _ = model.encoder(tokens, mask)
            results.append((feats, model(towers)))
        # fp32 sums over tokens in different orders: agreement to ~1e-6, 1e-5 allowed
        for feats, logits in results[1:]:
            for i, n in enumerate(lengths.tolist()):
                torch.testing.assert_close(feats[i, :n], results[0][0][i, :n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(logits, results[0][1], atol=1e-5, rtol=1e-5)
        # no padding at all: mask=None (the fast path) is the same as an all-true mask
        full = torch.ones(3, 40, dtype=torch.bool)
        torch.testing.assert_close(model([(real, None)] * len(towers)), model([(real, full)] * len(towers)),
                                   atol=1e-5, rtol=1e-5)
        # control: the same junk seen as real tokens does change the outputs
        tokens, mask = padded(80, 3)
        unmasked = [(tokens, torch.ones_like(mask))] * (2 if two_tower else 1)
        assert (model(unmasked) - results[0][1]).abs().max() > 1e-3


def test_configs_carry_the_paper_settings_at_equal_budgets():
    # MATH.md §6.4: layers, width, heads, MLP, batch, lr, dropout, wd, iters, warmup
    paper = {"listops": (6, 512, 8, 2048, 64, 1e-4, 0.1, 1e-2, 90000, 3000),
             "text": (4, 256, 4, 1024, 32, 1e-4, 0.1, 1e-2, 25000, 10000),
             "retrieval": (6, 128, 4, 512, 64, 1e-4, 0.1, 4e-2, 92000, 10000),
             "image": (8, 64, 8, 128, 64, 1e-4, 0.0, 2e-2, 180000, 9000),
             "pathfinder": (2, 64, 2, 128, 256, 2e-4, 0.1, 0.0, 200000, 312)}
    keys = ("n_layer", "n_embd", "n_head", "mlp_hidden", "batch_size", "learning_rate", "dropout", "weight_decay",
            "max_iters", "warmup_iters")
    def settings(name):
        return cli.configure(train.DEFAULTS, [os.path.join(CONFIGS, f"{name}.py")])[0]

    for task, row in paper.items():
        tost, soft = settings(f"{task}_tost"), settings(f"{task}_softmax")
        tost.batch_size *= tost.gradient_accumulation_steps  # examples per optimizer step
        assert tuple(getattr(tost, k) for k in keys) == row and tost.attn == "tssa" and tost.task == task
        assert soft.attn == "softmax" and soft.task == task
        assert all(getattr(soft, k) == getattr(tost, k) for k in keys if k != "mlp_hidden")
    pairs = sorted(f[:-len("_tost.py")] for f in os.listdir(CONFIGS) if f.endswith("_tost.py"))
    assert set(paper) <= set(pairs)
    for name in pairs:  # every ToST config has a softmax partner of the same size (the LRA rule: 10%)
        tost, soft = settings(f"{name}_tost"), settings(f"{name}_softmax")
        n_tost, n_soft = train.count_params(tost), train.count_params(soft)
        assert abs(n_soft - n_tost) / n_tost < 0.10, (name, n_tost, n_soft)
        assert {k: v for k, v in vars(soft).items() if k not in ("attn", "mlp_hidden", "out_dir")} == \
               {k: v for k, v in vars(tost).items() if k not in ("attn", "mlp_hidden", "out_dir")}
        train.check_settings(tost), train.check_settings(soft)  # every config passes the checks
    assert settings("listops_tost").lr_schedule == "invsqrt" and settings("pathfinder_tost").norm == "post"


# -----------------------------------------------------------------------------
# training


def tiny_args(data_dir, out_dir, **over):
    """configs/listops_tiny_tost.py (the README's tiny rows), shortened to 200 steps."""
    args = dict(data_dir=data_dir, out_dir=out_dir, max_iters=200, eval_interval=100, log_interval=1000)
    args.update(over)
    return [os.path.join(CONFIGS, "listops_tiny_tost.py")] + [f"--{k}={v}" for k, v in args.items()]


@pytest.fixture(scope="module")
def tiny_listops(tmp_path_factory):
    out = tmp_path_factory.mktemp("listops")
    generate.write_listops(str(out), n_train=2000, n_val=400, n_test=400, seed=0, min_len=10, max_len=60,
                           max_depth=3, max_args=5)
    return str(out)


def test_tiny_listops_model_beats_the_majority_class(tiny_listops, tmp_path):
    result = train.main(tiny_args(tiny_listops, str(tmp_path)))
    majority = {s: np.bincount(load_split("listops", s, tiny_listops).labels).max() / 400 for s in ("val", "test")}
    assert result["best_val_acc"] > majority["val"] + 0.05, (result, majority)
    assert result["test_acc_at_best_val"] > majority["test"] + 0.05, (result, majority)


def test_resume_continues_exactly(tiny_listops, tmp_path):
    common = dict(max_iters=12, eval_interval=6, lr_decay_iters=12, dropout=0.1, n_train=200, n_eval=32)
    straight = train.main(tiny_args(tiny_listops, str(tmp_path / "a"), **common))
    train.main(tiny_args(tiny_listops, str(tmp_path / "b"), **{**common, "max_iters": 6}))
    resumed = train.main(tiny_args(tiny_listops, str(tmp_path / "b"), **common, init_from="resume"))
    a = checkpoints.load_checkpoint(str(tmp_path / "a" / "ckpt.pt"), "lra")
    b = checkpoints.load_checkpoint(str(tmp_path / "b" / "ckpt.pt"), "lra")
    assert a["iter_num"] == b["iter_num"] == 12
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key  # bit for bit: same batches, dropout, optimizer
    assert straight["val_acc"] == resumed["val_acc"]
    with pytest.raises(cli.ConfigError, match="unknown setting"):
        train.main(["--no_such_setting=1"])
    with pytest.raises(cli.UserError, match="--init_from=resume"):  # a scratch run never overwrites one
        train.main(tiny_args(tiny_listops, str(tmp_path / "a"), **common))


def test_batch_size_is_per_process_per_micro_step(tiny_listops, tmp_path):
    """batch_size x gradient_accumulation_steps examples per step: 2 micro-steps of 16 pick the
    same 32 examples as one of 32, so the weights agree up to float rounding (the gradient
    sums in another order)."""
    common = dict(max_iters=3, eval_interval=3, n_train=200, n_eval=16, dropout=0.0)
    train.main(tiny_args(tiny_listops, str(tmp_path / "one"), **common, batch_size=32))
    train.main(tiny_args(tiny_listops, str(tmp_path / "two"), **common, batch_size=16, gradient_accumulation_steps=2))
    a, b = (checkpoints.load_checkpoint(str(tmp_path / d / "ckpt.pt"), "lra")["model"] for d in ("one", "two"))
    for key in a:  # float32, 3 Adam steps of lr 4e-3: differences of ~1e-7
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5)
    record = [json.loads(line) for line in open(tmp_path / "two" / "log.jsonl")][-1]
    assert {"iter", "lr", "train_loss", "val_loss", "val_acc", "time_s"} <= record.keys()


def _write_listops(folder, rows):
    os.makedirs(folder / "listops-1000", exist_ok=True)
    for split in ("train", "val", "test"):
        (folder / "listops-1000" / f"basic_{split}.tsv").write_text("Source\tTarget\n" + "".join(r + "\n" for r in rows))


@pytest.mark.parametrize("bad_row, words", [
    ("( [MAX 4 3 ] )\tfour", "label 'four' is not an integer"),
    ("( [MAX 4 3 ] )\t12", "label 12 is out of range"),
    ("( [MAX 4 x ] )\t4", "unknown ListOps token 'x'"),
    ("( [MAX 4 3 ] ) 4", "expected 'Source<TAB>Target'"),
])
def test_malformed_listops_lines_name_the_file_and_line(bad_row, words, tmp_path):
    _write_listops(tmp_path, ["( [MAX 4 3 ] )\t4", bad_row])
    with pytest.raises(SystemExit) as exit:  # what the command line does: run_cli's one line, status 1
        cli.run_cli(train.main, [f"--data_dir={tmp_path}", "--cache_dir=", f"--out_dir={tmp_path / 'out'}",
                                 "--device=cpu"])
    message = str(exit.value.code)
    assert "\n" not in message and "basic_val.tsv:3: " in message and words in message  # val is read first


def test_retrieval_label_out_of_range_is_caught_when_loading(tmp_path):
    folder = tmp_path / "tsv_data"
    folder.mkdir()
    (folder / "new_aan_pairs.train.tsv").write_text("1\ta\tb\tx\ty\n2\ta\tb\tx\ty\n", encoding="utf-8")
    with pytest.raises(cli.UserError, match=r"new_aan_pairs.train.tsv:2: label 2 is out of range"):
        load_split("retrieval", "train", data_dir=str(tmp_path))


def test_cropping_to_a_short_max_len_is_said_once(tiny_listops, tmp_path, capsys):
    """The tiny config's max_len (64) on longer data crops silently no more: train.py says how
    many sequences of each split were cut and to what length."""
    data = load_split("listops", "val", tiny_listops, max_len=20)
    full = load_split("listops", "val", tiny_listops)
    longer = int((full.inputs[0].lengths() > 20).sum())
    assert 0 < longer < len(full) and data.cropped == longer and data.subset(100).cropped == int(
        (full.inputs[0].lengths()[:100] > 20).sum())
    train.main(tiny_args(tiny_listops, str(tmp_path), max_len=20, max_iters=1, eval_interval=1, n_train=64, n_eval=32))
    out = capsys.readouterr().out
    n_val = int((full.inputs[0].lengths()[:32] > 20).sum())
    assert f"listops val: {n_val:,} of 32 sequences are longer than max_len and were cropped to 20 tokens" in out
    assert out.count("listops train:") == 1
