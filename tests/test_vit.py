"""
Tests of the vision scripts (vit_train.py, vit_inspect.py): a small ToST-ViT learns the
built-in shapes task; resume is exact; the image-folder loader reads a tree of PNGs written
here; fine-tuning swaps the head; the augmentations do what they claim; the picture command
writes valid PNGs of the documented sizes and its R_var numbers equal compression_objective
on the same tensors. CPU, offline, about 20 s.

    python -m pytest -q tests/test_vit.py
"""

import json
import os
import struct
import sys
import zlib

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never reach for the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest
import torch

import pngio
import trainkit
import vit_inspect
import vit_train
from model import VIT_PRESETS, compression_objective

torch.set_num_threads(1)  # tiny models: one thread is fastest, and steady on a shared machine
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a tiny ToST on 16x16 shapes, 4 classes (chance 25%), no heavy augmentation
TINY = ["--shapes_source_size=16", "--img_size=16", "--patch_size=4", "--n_layer=2", "--n_head=4", "--n_embd=64",
        "--shapes_num_classes=4", "--shapes_train_size=4000", "--shapes_val_size=500", "--batch_size=32",
        "--crop_scale=(1.0, 1.0)", "--randaug_n=0", "--mixup=0", "--cutmix=0", "--label_smoothing=0",
        "--eval_crop_pct=1.0", "--dtype=float32", "--device=cpu"]


def read_log(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ToST trained 300 steps on shapes (its out_dir)."""
    out = str(tmp_path_factory.mktemp("vit_tiny"))
    vit_train.main(TINY + [f"--out_dir={out}", "--max_iters=300", "--eval_interval=300", "--log_interval=50",
                           "--learning_rate=1e-3", "--warmup_iters=20"])
    return out


# -----------------------------------------------------------------------------
# training


def test_small_tost_learns_the_shapes_task(trained):
    evals = read_log(trained, "eval")
    assert [e["iter"] for e in evals] == [0, 300]
    # 4 balanced classes, 500 val images: chance is 25% with a standard deviation of ~2%, so
    # 40% is more than 7 standard deviations above chance (measured here: ~55-65%)
    assert evals[-1]["val_top1"] > 0.40, evals
    train = read_log(trained, "train")
    assert train[-1]["loss"] < train[0]["loss"] - 0.1, train


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path):
    # every source of randomness on: crops, flips, RandAugment, mixup/cutmix, dropout, drop path;
    # 64 images at batch 16 = 4 steps per epoch, so the 8 steps cross epochs and the resume point
    base = ["--shapes_source_size=16", "--img_size=16", "--patch_size=4", "--n_layer=2", "--n_head=2", "--n_embd=32",
            "--shapes_train_size=64", "--shapes_val_size=32", "--batch_size=16", "--eval_interval=4",
            "--log_interval=1", "--lr_decay_iters=8", "--warmup_iters=2", "--dropout=0.1", "--drop_path=0.2",
            "--crop_scale=(0.3, 1.0)", "--randaug_n=2", "--mixup=0.8", "--cutmix=1.0", "--dtype=float32",
            "--device=cpu"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    vit_train.main(base + [f"--out_dir={a}", "--max_iters=8"])
    vit_train.main(base + [f"--out_dir={b}", "--max_iters=5"])
    vit_train.main(base + [f"--out_dir={b}", "--max_iters=8", "--init_from=resume"])
    losses_a = [(r["iter"], r["loss"]) for r in read_log(a, "train")]
    losses_b = [(r["iter"], r["loss"]) for r in read_log(b, "train")]
    assert [i for i, _ in losses_a] == list(range(1, 9))
    assert losses_a == losses_b  # bit-identical on CPU fp32: same ops, same order, same data
    sd_a = trainkit.load_checkpoint(os.path.join(a, "ckpt.pt"))["model"]
    sd_b = trainkit.load_checkpoint(os.path.join(b, "ckpt.pt"))["model"]
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_finetune_replaces_the_head_and_keeps_the_body(trained, tmp_path):
    src = trainkit.load_checkpoint(os.path.join(trained, "ckpt.pt"))
    out = str(tmp_path / "ft")
    vit_train.main(TINY + [f"--out_dir={out}", "--init_from=finetune", f"--finetune_from={trained}/ckpt.pt",
                           "--shapes_num_classes=6", "--max_iters=0"])
    ft = trainkit.load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ft["model_args"]["num_classes"] == 6 and ft["model"]["head.weight"].shape == (6, 64)
    body = [k for k in src["model"] if not k.startswith("head.")]
    assert body and all(torch.equal(src["model"][k], ft["model"][k]) for k in body)
    # resuming a plain run on a dataset with another number of classes is refused clearly
    with pytest.raises(ValueError, match="finetune"):
        vit_train.main(TINY + [f"--out_dir={trained}", "--init_from=resume", "--shapes_num_classes=6",
                               "--max_iters=0"])


def test_clear_errors_for_bad_data_settings(tmp_path):
    with pytest.raises(trainkit.ConfigError, match="unknown dataset"):
        vit_train.main(["--dataset=mnist"])
    with pytest.raises(FileNotFoundError, match="data_dir"):
        vit_train.main(["--dataset=folder", f"--data_dir={tmp_path / 'missing'}"])
    with pytest.raises(trainkit.ConfigError, match="did you mean|Did you mean"):
        vit_train.main(["--mixupp=0.5"])
    # a hub dataset with no network: a RuntimeError that says what to do instead
    with pytest.raises(RuntimeError, match="Pillow|dataset='shapes'"):
        vit_train.build_sources({**vit_train.DEFAULTS, "dataset": "cifar10"})


# -----------------------------------------------------------------------------
# data


def encode_png_filtered(pixels):
    """An independent PNG writer for the tests: uint8 (H, W), (H, W, 3) or (H, W, 4), row y
    filtered with filter type y % 5, so the reader's None/Sub/Up/Average/Paeth all run."""
    pixels = np.asarray(pixels, np.uint8)
    H, W = pixels.shape[:2]
    C = 1 if pixels.ndim == 2 else pixels.shape[2]
    rows = pixels.reshape(H, W * C).astype(np.int64)
    out = bytearray()
    for y in range(H):
        cur = rows[y]
        up = rows[y - 1] if y else np.zeros_like(cur)
        left = np.concatenate([np.zeros(C, np.int64), cur[:-C]])
        upleft = np.concatenate([np.zeros(C, np.int64), up[:-C]])
        kind = y % 5
        if kind == 0:
            pred = np.zeros_like(cur)
        elif kind == 1:
            pred = left
        elif kind == 2:
            pred = up
        elif kind == 3:
            pred = (left + up) // 2
        else:
            p = left + up - upleft
            pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upleft))
        out += bytes([kind]) + ((cur - pred) % 256).astype(np.uint8).tobytes()
    colour = {1: 0, 3: 2, 4: 6}[C]
    chunk = lambda k, d: struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(out))) + chunk(b"IEND", b""))


def write_tree(root, classes, per_class, rng, size=(11, 13)):
    """root/<class>/<i>.png with random RGB, grey or RGBA pixels; returns {path: pixels}."""
    written = {}
    for k, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            shape = [size + (3,), size, size + (4,)][(k + i) % 3]
            pixels = rng.integers(0, 256, shape, dtype=np.uint8)
            path = os.path.join(root, name, f"{i:03d}.png")
            with open(path, "wb") as f:
                f.write(encode_png_filtered(pixels))
            written[path] = pixels
    return written


def expected_rgb(pixels):  # what the loader should return for the written pixels: (3, H, W)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[:, :, None], 3, axis=2)
    return torch.from_numpy(np.ascontiguousarray(pixels[:, :, :3])).permute(2, 0, 1)


def test_image_folder_loader_reads_a_tree_of_pngs(tmp_path):
    rng = np.random.default_rng(0)
    classes = ["cat", "dog", "zebra"]
    written = write_tree(str(tmp_path / "train"), classes, 4, rng)
    written.update(write_tree(str(tmp_path / "val"), ["dog", "zebra"], 2, rng))  # a subset of classes
    train, val = vit_train.folder_sources(str(tmp_path), 0.1)
    assert train.classes == classes and val.classes == classes
    assert len(train) == 12 and len(val) == 4
    for src in (train, val):
        for i in range(len(src)):
            img, label = src.get(i)
            path = src.paths[i]
            assert classes[label] == os.path.basename(os.path.dirname(path))
            assert torch.equal(img, expected_rgb(written[path])), path  # decoded exactly
    # one tree without train/val: the last val_fraction of each class is held out
    flat = str(tmp_path / "flat")
    write_tree(flat, ["a", "b"], 10, rng)
    train, val = vit_train.folder_sources(flat, 0.2)
    assert len(train) == 16 and len(val) == 4
    assert [os.path.basename(p) for p in val.paths] == ["008.png", "009.png"] * 2
    assert not set(train.paths) & set(val.paths)


def test_training_on_an_image_folder(tmp_path):
    rng = np.random.default_rng(1)
    write_tree(str(tmp_path / "data" / "train"), ["a", "b"], 8, rng, size=(16, 16))
    write_tree(str(tmp_path / "data" / "val"), ["a", "b"], 2, rng, size=(16, 16))
    out = str(tmp_path / "out")
    vit_train.main(["--dataset=folder", f"--data_dir={tmp_path / 'data'}", f"--out_dir={out}", "--img_size=16",
                    "--patch_size=4", "--n_layer=1", "--n_head=2", "--n_embd=16", "--batch_size=8", "--max_iters=2",
                    "--eval_interval=2", "--crop_scale=(0.5, 1.0)", "--dtype=float32", "--device=cpu"])
    ck = trainkit.load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ck["classes"] == ["a", "b"] and ck["iter_num"] == 2 and ck["model_args"]["num_classes"] == 2


def test_shapes_dataset_is_deterministic_and_balanced():
    x1, y1 = vit_train.make_shapes(200, 16, 10, seed=3)
    x2, y2 = vit_train.make_shapes(200, 16, 10, seed=3)
    x3, _ = vit_train.make_shapes(200, 16, 10, seed=4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    assert torch.bincount(y1).tolist() == [20] * 10
    assert x1.shape == (200, 3, 16, 16) and x1.dtype == torch.uint8
    assert x1.float().std((1, 2, 3)).min() > 5  # every image has content, none is flat


def test_train_batches_are_disjoint_shards_and_resumable():
    it = iter(vit_train.TrainBatches(20, 4, 0, 1, seed=5))
    first = [next(it) for _ in range(12)]
    epoch0 = sorted(k for b in first[:5] for k in b)
    assert epoch0 == list(range(20))  # one epoch sees every image once
    assert sorted(k for b in first[5:10] for k in b) == list(range(20, 40))  # epoch 1 keys
    later = iter(vit_train.TrainBatches(20, 4, 0, 1, seed=5, start=7))
    assert [next(later) for _ in range(5)] == first[7:12]  # starting at step 7 = skipping 7
    ranks = [next(iter(vit_train.TrainBatches(20, 4, r, 2, seed=5))) for r in (0, 1)]
    assert not set(ranks[0]) & set(ranks[1])


# -----------------------------------------------------------------------------
# augmentation


def test_mixup_and_cutmix_targets_match_the_mixed_images():
    rng = np.random.default_rng(0)
    B, K = 6, 5
    x = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 3, 8, 8).contiguous()
    target = vit_train.smooth_targets(torch.arange(B) % K, K, 0.1)
    assert torch.allclose(target.sum(1), torch.ones(B))  # rows are distributions
    xm, tm, lam = vit_train.mix_batch(x, target, rng, mixup_alpha=0.0, cutmix_alpha=1.0, prob=1.0)
    own = (xm == x).float().mean((1, 2, 3))  # share of each image's own pixels
    assert torch.allclose(own[:2], torch.full((2,), lam))  # images 0, 1 differ from partners 5, 4
    assert torch.allclose(tm, lam * target + (1 - lam) * target.flip(0))
    xm, tm, lam = vit_train.mix_batch(x, target, rng, mixup_alpha=0.8, cutmix_alpha=0.0, prob=1.0)
    assert torch.allclose(xm[:, 0, 0, 0], lam * x[:, 0, 0, 0] + (1 - lam) * x.flip(0)[:, 0, 0, 0])
    assert torch.allclose(tm.sum(1), torch.ones(B))
    xm, tm, lam = vit_train.mix_batch(x, target, rng, mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0)
    assert lam == 1.0 and xm is x and tm is target  # switched off


def test_rand_augment_is_deterministic_in_range_and_changes_images():
    x = vit_train.make_shapes(16, 16, 10, seed=0)[0].float() / 255
    a = vit_train.rand_augment(x.clone(), 2, 9.0, torch.Generator().manual_seed(1))
    b = vit_train.rand_augment(x.clone(), 2, 9.0, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    # 1e-6: the affine warps add 0.5 back after sampling, which can round past 1 by an ulp
    assert a.min() >= -1e-6 and a.max() <= 1 + 1e-6
    assert (a - x).abs().amax((1, 2, 3)).gt(0.01).float().mean() > 0.5  # most images changed
    for name in vit_train.RANDAUG_OPS[1:]:  # every op keeps the shape and the range
        y = vit_train.apply_op(name, x[:4].clone(), torch.full((4,), 0.9), torch.tensor([1., -1., 1., -1.]))
        assert y.shape == x[:4].shape and y.min() >= -1e-6 and y.max() <= 1 + 1e-6, name
    # equalize spreads a dim, low-contrast image over the whole range
    dim = torch.linspace(0.2, 0.3, 64).view(1, 1, 8, 8).expand(1, 3, 8, 8).contiguous()
    eq = vit_train.apply_op("equalize", dim, torch.ones(1), torch.ones(1))
    assert eq.min() == 0 and eq.max() == 1


def test_random_resized_crop_boxes_stay_inside_and_respect_the_scale():
    rng = np.random.default_rng(0)
    for H, W in [(32, 32), (20, 50), (50, 20)]:
        for _ in range(200):
            top, left, h, w = vit_train.random_resized_crop_box(H, W, (0.25, 1.0), rng)
            assert 0 <= top and top + h <= H and 0 <= left and left + w <= W and h > 0 and w > 0
            assert h * w >= 0.2 * H * W  # 0.25 less rounding of h and w on these small images
    view = vit_train.CropView(vit_train.TensorSource(*vit_train.make_shapes(4, 32, 10, 0), vit_train.SHAPES),
                              24, train=True, crop_scale=(0.3, 1.0), seed=1)
    assert view[5][0].shape == (3, 24, 24)
    assert torch.equal(view[5][0], view[5][0])  # a crop is a function of (seed, epoch, index)
    assert not torch.equal(view[1][0], view[5][0])  # same image 1, epochs 0 and 1: new crop


def test_config_files_match_the_paper_presets():
    for name, preset in [("t", "tost-t"), ("s", "tost-s"), ("m", "tost-m")]:
        cfg = trainkit.configure(vit_train.DEFAULTS, [os.path.join(ROOT, "config", f"vit_tost_{name}.py")])
        for key, value in VIT_PRESETS[preset].items():
            assert cfg[key] == value, (name, key)
        assert cfg["patch_size"] == 16 and cfg["img_size"] == 224 and cfg["dataset"] == "imagenet-1k"
        assert cfg["batch_size"] * cfg["gradient_accumulation_steps"] == 2048  # notes §6
        assert (cfg["mixup"], cfg["cutmix"], cfg["label_smoothing"], cfg["weight_decay"]) == (0.8, 1.0, 0.1, 0.05)
        assert cfg["max_iters"] == 400 * 625 and cfg["warmup_iters"] == 5 * 625  # 400 and 5 epochs
    cpu = trainkit.configure(vit_train.DEFAULTS, [os.path.join(ROOT, "config", "vit_cpu.py")])
    assert cpu["dataset"] == "shapes"


# -----------------------------------------------------------------------------
# seeing inside


def read_png(path):
    """Check a PNG's structure independently of the code under test: signature, chunk CRCs,
    IHDR, and that IDAT inflates to exactly H rows of 1 + W * 3 bytes. Returns (W, H)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, kinds, idat = 8, [], b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        payload = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF, (path, kind)
        kinds.append(kind)
        if kind == b"IHDR":
            W, H, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", payload)
            assert (depth, colour, interlace) == (8, 2, 0)  # 8-bit RGB
        if kind == b"IDAT":
            idat += payload
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    assert len(zlib.decompress(idat)) == H * (1 + 3 * W)
    return W, H


def grid_size(ncols, nrows, cell):  # the layout vit_inspect.panel_grid documents (with its footer)
    P, L = vit_inspect.PAD, vit_inspect.LABEL_H
    return P + ncols * (cell + P), P + L + nrows * (L + cell + P) + L


@pytest.fixture(scope="module")
def inspected(trained, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inspect"))
    report = vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--out_dir={out}", "--n_show=2", "--layers=1,2",
                               "--n_rvar=24", "--batch_size=10"])
    return out, report


def test_inspect_writes_valid_pngs_of_the_expected_sizes(trained, inspected):
    out, report = inspected
    cell = 16 * (vit_inspect.PANEL_TARGET // 16)  # img_size 16 -> 128-pixel panels
    H = 4  # heads of the tiny model
    expected = {"rvar.png": (vit_inspect.PLOT_W, vit_inspect.PLOT_H)}
    for i in range(2):
        expected[f"pi_{i:02d}.png"] = grid_size(1 + H, 2, cell)  # input + heads, layers 1 and 2
        expected[f"cls_attn_{i:02d}.png"] = grid_size(1 + H, 1, cell)
    assert sorted(f for f in os.listdir(out) if f.endswith(".png")) == sorted(expected)
    for name, size in expected.items():
        assert read_png(os.path.join(out, name)) == size, name
        assert tuple(report["pngs"][name]) == size
    # the first panel of a row is the input image, upscaled: compare the decoded pixels
    ck = trainkit.load_checkpoint(os.path.join(trained, "ckpt.pt"))
    _, val = vit_train.build_sources({**vit_train.DEFAULTS, **ck["config"]})
    img = vit_train.CropView(val, 16, train=False, crop_pct=1.0)[1][0]  # val[1], shown second
    pixels = pngio.decode_png(open(os.path.join(out, "pi_01.png"), "rb").read())
    top = vit_inspect.PAD + 2 * vit_inspect.LABEL_H
    panel = pixels[top:top + cell, vit_inspect.PAD:vit_inspect.PAD + cell]
    assert np.array_equal(panel, img.permute(1, 2, 0).numpy().repeat(8, 0).repeat(8, 1))
    assert [e["true"] for e in report["images"]] == [vit_train.SHAPES[val.get(i)[1]] for i in (0, 1)]


def test_inspect_rvar_equals_compression_objective_on_the_same_tensors(trained, inspected):
    _, report = inspected
    ck = trainkit.load_checkpoint(os.path.join(trained, "ckpt.pt"))
    model = vit_train.model_from_checkpoint(ck).eval()
    cfg = {**vit_train.DEFAULTS, **ck["config"]}
    sources = dict(zip(("train", "val"), vit_train.build_sources(cfg)))
    for split, src in sources.items():
        rec = report["rvar"][split]
        view = vit_train.CropView(src, 16, train=False, crop_pct=1.0)
        x = torch.stack([view[i][0] for i in rec["indices"]]).float() / 255
        x = (x - 0.5) / 0.5  # the shapes normalisation
        with torch.no_grad():
            _, maps = model(x, return_maps=True)
            before, after = [], []
            for block, m in zip(model.blocks, maps["layers"]):
                B, N, C = m["z"].shape
                before.append(compression_objective(m["w"], m["pi"]).double().mean())
                z_after = m["z"] + block.ls_1.gamma * m["out"]  # the step, through the layer scale
                w_after = block.attn.c_in(z_after).view(B, N, 4, C // 4).transpose(1, 2)
                after.append(compression_objective(w_after, m["pi"]).double().mean())
        assert len(rec["indices"]) == 24 and len(set(rec["indices"])) == 24
        # rtol 1e-5: the same fp32 operations, but batched 10 at a time there and 24 at once here,
        # which can change matmul blocking (fp32 rounding ~1e-7 relative, a few ops deep)
        assert np.allclose(rec["before"], before, rtol=1e-5, atol=0), (split, rec["before"], before)
        assert np.allclose(rec["after"], after, rtol=1e-5, atol=0), (split, rec["after"], after)
    # the per-image values of the shown images (val[0], val[1]) as well
    view = vit_train.CropView(sources["val"], 16, train=False, crop_pct=1.0)
    x = (torch.stack([view[i][0] for i in (0, 1)]).float() / 255 - 0.5) / 0.5
    with torch.no_grad():
        _, maps = model(x, return_maps=True)
    for i, entry in enumerate(report["images"]):
        ref = [compression_objective(m["w"], m["pi"])[i].item() for m in maps["layers"]]
        assert np.allclose(entry["rvar_before"], ref, rtol=1e-5, atol=0)


def test_within_layer_check_sees_a_tied_gradient_step_lower_r_var():
    """The before/after measurement of vit_inspect has the right signs: tie each block's output
    map to the theory's (c_proj = (tau/N) U, notes §2, no bias, layer scale 1), and every step
    must lower R_var; flip its sign (an ascent step) and every step must raise it."""
    torch.manual_seed(0)
    model = vit_train.ToSTViT(vit_train.ViTConfig(img_size=16, patch_size=4, n_layer=2, n_head=4, n_embd=32,
                                                  num_classes=3)).eval()
    x = torch.randn(6, 3, 16, 16)
    N, tau = (16 // 4) ** 2, 0.5
    for sign, lowered in ((1.0, True), (-1.0, False)):
        with torch.no_grad():
            for block in model.blocks:
                # c_in: w = W_in z + b, so grad_z R_var = W_in^T dR/dw and dR/dw = -TSSA(w) / N
                block.attn.c_proj.weight.copy_(sign * tau / N * block.attn.c_in.weight.T)
                block.attn.c_proj.bias.zero_()
                block.ls_1.gamma.fill_(1.0)
        before, after = vit_inspect.rvar_before_after(model, x)[:2]  # (6, 2) each
        assert bool(((after < before) if lowered else (after > before)).all()), (sign, before, after)


def test_inspect_on_a_folder_of_images(trained, tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "pics"
    folder.mkdir()
    for i in range(3):  # sizes other than the model's: centre-cropped and resized to 16
        with open(folder / f"p{i}.png", "wb") as f:
            f.write(encode_png_filtered(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)))
    out = str(tmp_path / "out")
    report = vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--images={folder}", f"--out_dir={out}",
                               "--layers=2", "--n_rvar=4"])
    assert [e["source"] for e in report["images"]] == [str(folder / f"p{i}.png") for i in range(3)]
    assert report["layers_shown"] == [2]
    assert all(e["true"] is None and e["predicted"] in ("disk", "ring", "triangle", "plus")
               for e in report["images"])  # no true class for a user's image; a prediction
    for i in range(3):
        assert read_png(os.path.join(out, f"pi_{i:02d}.png")) == grid_size(5, 1, 128)
    with pytest.raises(trainkit.ConfigError, match="out of range"):
        vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--out_dir={out}", "--layers=3"])
