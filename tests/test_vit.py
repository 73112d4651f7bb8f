"""
Tests of ToST-ViT as released and of the vision code (vit_train.py, vit_data.py,
vit_inspect.py): the class-attention block against its equations written out, the same
stochastic depth in every block, the Fourier positions; a small ToST learns the built-in
shapes; resume is exact; max_time stops a run; two gloo processes match one; image folders are
read with Pillow; fine-tuning swaps the head; the pictures are written and the R_var numbers
equal compression_objective on the same tensors. The paper recipe through timm runs only where
timm imports (skipped otherwise). CPU, offline.

    python -m pytest -q tests/test_vit.py
"""

import json
import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never reach for the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import vit_inspect
import vit_train
from model import VIT_PRESETS, ClassAttentionBlock, ToSTViT, ViTConfig, compression_objective
from nanotost import checkpoints, cli, loading, trainkit, vit_data

torch.set_num_threads(1)  # tiny models: one thread is fastest, and steady on a shared machine
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a tiny ToST on 16x16 shapes, 4 classes (chance 25%), no heavy augmentation
TINY = ["--shapes_source_size=16", "--img_size=16", "--patch_size=4", "--n_layer=2", "--n_head=4", "--n_embd=64",
        "--shapes_num_classes=4", "--shapes_train_size=4000", "--shapes_val_size=500", "--batch_size=32",
        "--crop_scale=(1.0, 1.0)", "--hflip=False", "--mixup=0", "--cutmix=0", "--label_smoothing=0",
        "--eval_crop_pct=1.0", "--dtype=float32", "--device=cpu"]


def settings(**changes):
    """vit_train's settings, as main() holds them, with `changes`."""
    return SimpleNamespace(**{**vit_train.DEFAULTS, **changes})


def train(argv):
    """vit_train.main(argv), then out_dir's lock released as run_cli releases it (the next run
    in this process may claim the same out_dir)."""
    try:
        return vit_train.main(argv)
    finally:
        trainkit.release_out_dir([a for a in argv if a.startswith("--out_dir=")][-1][len("--out_dir="):])


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


# -----------------------------------------------------------------------------
# the model as released


def test_class_attention_block_follows_the_xcit_equations():
    """XCiT class attention with tokens_norm=True, written out here from MATH.md §5.4."""
    torch.manual_seed(0)
    C, H, N = 16, 2, 5
    blk = ClassAttentionBlock(n_embd=C, n_head=H, layer_scale_init=1.0).eval()
    with torch.no_grad():  # nothing at its initial value, so every term shows
        for p in blk.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    x = torch.randn(3, 1 + N, C, dtype=torch.float64)
    P = {k: v.double() for k, v in blk.state_dict().items()}
    ln = lambda t, i: F.layer_norm(t, (C,), P[f"ln_{i}.weight"], P[f"ln_{i}.bias"], eps=1e-6)
    n = ln(x, 1)
    q = n[:, :1] @ P["attn.q.weight"].T + P["attn.q.bias"]  # (B, 1, C)
    k, v = (n @ P["attn.kv.weight"].T + P["attn.kv.bias"]).split(C, dim=-1)  # (B, 1 + N, C)
    heads = []
    for h in range(H):
        s = slice(h * C // H, (h + 1) * C // H)
        a = (q[..., s] @ k[..., s].transpose(1, 2) / math.sqrt(C // H)).softmax(-1)  # (B, 1, 1 + N)
        heads.append(a @ v[..., s])
    attn_out = torch.cat(heads, -1) @ P["attn.c_proj.weight"].T + P["attn.c_proj.bias"]
    g1, g2 = P["attn_scale.weight"], P["mlp_scale.weight"]
    cls, patches = x[:, :1] + g1 * attn_out, x[:, 1:] + g1 * n[:, 1:]  # the NORMED patches join in
    y = ln(torch.cat([cls, patches], 1), 2)  # LN2 on the residual stream, every token
    mlp = F.gelu(y[:, :1] @ P["mlp.c_fc.weight"].T + P["mlp.c_fc.bias"]) @ P["mlp.c_proj.weight"].T + P["mlp.c_proj.bias"]
    expected = torch.cat([y[:, :1] + g2 * mlp, 2 * y[:, 1:]], 1)  # patches leave doubled
    got = blk.double()(x)
    # float64 both sides; 1e-10 leaves room for the different order of the sums
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_released_drop_path_eps_and_positions():
    for name, rate in (("tost-t", 0.0), ("tost-s", 0.05), ("tost-m", 0.15)):
        assert VIT_PRESETS[name]["drop_path"] == rate
    m = ToSTViT(ViTConfig(img_size=32, patch_size=8, n_layer=3, n_head=2, n_embd=64, num_classes=3, drop_path=0.1))
    assert [b.drop_path.p for b in m.blocks] == [0.1] * 3  # the same rate in every block, no ramp
    assert [b.drop_path.p for b in m.cls_blocks] == [0.0] * 2  # class attention: none (XCiT)
    assert {mod.eps for mod in m.modules() if isinstance(mod, torch.nn.LayerNorm)} == {1e-6}
    pe = m.pos_embed  # hidden 32 -> 64 channels: make the 1x1 conv the identity to see the features
    with torch.no_grad():
        pe.proj.weight.copy_(torch.eye(64).view(64, 64, 1, 1)), pe.proj.bias.zero_()
        got = pe(1, 3, 5, "cpu")[0].double()  # (64, 3, 5)
    rows = torch.arange(1, 4, dtype=torch.float64) / (3 + 1e-6) * 2 * math.pi
    cols = torch.arange(1, 6, dtype=torch.float64) / (5 + 1e-6) * 2 * math.pi
    freq = 10000.0 ** (2 * 3 / 32)  # channel 6 / 7: sin / cos at the fourth frequency
    # float32 features against float64 here: 1e-6 covers the rounding of angles up to 2 pi
    torch.testing.assert_close(got[6], (rows / freq).sin()[:, None].expand(3, 5), rtol=0, atol=1e-6)
    torch.testing.assert_close(got[32 + 7], (cols / freq).cos()[None, :].expand(3, 5), rtol=0, atol=1e-6)


# -----------------------------------------------------------------------------
# training


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ToST trained 300 steps on shapes (its out_dir)."""
    out = str(tmp_path_factory.mktemp("vit_tiny"))
    train(TINY + [f"--out_dir={out}", "--max_iters=300", "--eval_interval=300", "--log_interval=50",
                           "--learning_rate=1e-3", "--warmup_iters=20"])
    return out


def test_small_tost_learns_the_shapes_task(trained):
    log = read_log(trained)
    assert [r["iter"] for r in log] == [0, 300]
    assert set(log[-1]) == {"iter", "lr", "train_loss", "val_loss", "val_acc", "time_s"}
    # 4 balanced classes, 500 val images: chance is 25% with a standard deviation of ~2%, so
    # 40% is more than 7 standard deviations above chance
    assert log[-1]["val_acc"] > 0.40, log
    assert log[-1]["train_loss"] < math.log(4) - 0.1, log
    ck = checkpoints.load_checkpoint(os.path.join(trained, "ckpt.pt"), "vit")
    assert {"kind", "model", "optimizer", "scaler", "model_args", "iter_num", "best_val_loss", "best_val_acc",
            "config", "rng", "classes"} <= set(ck) and ck["kind"] == "vit"


# every source of randomness of the built-in recipe on: crops, flips, mixup / cutmix, dropout,
# drop path; 64 images at batch 16 = 4 micro-batches per epoch, so 8 steps cross epochs
RANDOM = ["--shapes_source_size=16", "--img_size=16", "--patch_size=4", "--n_layer=2", "--n_head=2", "--n_embd=32",
          "--shapes_train_size=64", "--shapes_val_size=32", "--batch_size=16", "--eval_interval=1",
          "--log_interval=1", "--lr_decay_iters=8", "--warmup_iters=2", "--dropout=0.1", "--drop_path=0.2",
          "--crop_scale=(0.3, 1.0)", "--mixup=0.8", "--cutmix=1.0", "--dtype=float32", "--device=cpu"]


def losses(out):
    return [(r["iter"], r["train_loss"]) for r in read_log(out)]


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train(RANDOM + [f"--out_dir={a}", "--max_iters=8"])
    train(RANDOM + [f"--out_dir={b}", "--max_iters=5"])
    train(RANDOM + [f"--out_dir={b}", "--max_iters=8", "--init_from=resume"])
    assert [i for i, _ in losses(a)] == list(range(9))
    assert losses(a) == losses(b)  # bit-identical on CPU fp32: same ops, same order, same data
    sd_a = checkpoints.load_checkpoint(os.path.join(a, "ckpt.pt"), "vit")["model"]
    sd_b = checkpoints.load_checkpoint(os.path.join(b, "ckpt.pt"), "vit")["model"]
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_max_time_evaluates_saves_and_stops(tmp_path):
    """As train.py: once max_time has passed (here at once), the run evaluates, saves and stops
    at the next iteration."""
    out = str(tmp_path / "out")
    train(RANDOM + [f"--out_dir={out}", "--max_iters=8", "--eval_interval=100", "--max_time=1e-9"])
    assert [i for i, _ in losses(out)] == [0, 1]
    assert checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")["iter_num"] == 1


def test_two_gloo_processes_match_one_with_two_micro_steps(tmp_path):
    """torchrun, 2 CPU processes x 1 micro-batch == 1 process x 2 micro-batches: the same
    images and augmentations at every step (the data position does not depend on world size).
    Dropout and drop path draw from each process's own generator (seed + rank): off here."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    common = RANDOM + ["--max_iters=3", "--gradient_accumulation_steps=2", "--num_threads=1", "--dropout=0",
                       "--drop_path=0"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    train(common + [f"--out_dir={one}"])
    p = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", os.path.join(ROOT, "vit_train.py"), *common,
                        f"--out_dir={two}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    la, lb = losses(one), losses(two)
    assert [i for i, _ in la] == [i for i, _ in lb] == [0, 1, 2, 3]
    # float32: the gradient is summed in another order (all-reduce vs accumulation); 1e-5 relative
    assert np.allclose([l for _, l in la[1:]], [l for _, l in lb[1:]], rtol=1e-5, atol=0), (la, lb)
    pa = checkpoints.load_checkpoint(os.path.join(one, "ckpt.pt"), "vit")["model"]
    pb = checkpoints.load_checkpoint(os.path.join(two, "ckpt.pt"), "vit")["model"]
    for k in pa:  # weights (not BatchNorm running statistics: under DDP they are rank 0's)
        if "running" not in k and "num_batches" not in k:
            torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=1e-6)


def test_finetune_replaces_the_head_and_keeps_the_body(trained, tmp_path):
    src = checkpoints.load_checkpoint(os.path.join(trained, "ckpt.pt"), "vit")
    out = str(tmp_path / "ft")
    train(TINY + [f"--out_dir={out}", "--init_from=finetune", f"--finetune_from={trained}/ckpt.pt",
                           "--shapes_num_classes=6", "--max_iters=0"])
    ft = checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")
    assert ft["model_args"]["num_classes"] == 6 and ft["model"]["head.weight"].shape == (6, 64)
    body = [k for k in src["model"] if not k.startswith("head.")]
    assert body and all(torch.equal(src["model"][k], ft["model"][k]) for k in body)
    with pytest.raises(cli.UserError, match="finetune"):  # resuming with other classes: refused
        train(TINY + [f"--out_dir={trained}", "--init_from=resume", "--shapes_num_classes=6",
                               "--max_iters=0"])


def test_config_files_match_the_release():
    for name, preset in [("t", "tost-t"), ("s", "tost-s"), ("m", "tost-m")]:
        cfg, _ = cli.configure(vit_train.DEFAULTS, [os.path.join(ROOT, "config", f"vit_tost_{name}.py")])
        vit_train.check_settings(cfg)
        for key, value in VIT_PRESETS[preset].items():
            assert getattr(cfg, key) == value, (name, key)
        assert cfg.patch_size == 16 and cfg.img_size == 224 and cfg.dataset == "imagenet-1k"
        assert cfg.batch_size * cfg.gradient_accumulation_steps == 2048  # MATH.md §6.3
        assert cfg.recipe == "paper" and cfg.randaugment == "rand-m9-mstd0.5-inc1"
        assert (cfg.random_erasing, cfg.repeated_aug, cfg.eval_crop_pct) == (0.25, 3, 0.875)
        assert (cfg.mixup, cfg.cutmix, cfg.label_smoothing, cfg.weight_decay) == (0.8, 1.0, 0.1, 0.05)
        assert cfg.max_iters == 400 * 625 and cfg.warmup_iters == 5 * 625  # 400 and 5 epochs
    ft, _ = cli.configure(vit_train.DEFAULTS, [os.path.join(ROOT, "config", "vit_finetune.py"),
                                               "--finetune_from=out-vit-tost-s/ckpt.pt"])
    vit_train.check_settings(ft)
    assert (ft.learning_rate, ft.weight_decay, ft.batch_size * ft.gradient_accumulation_steps) == (1e-4, 0.01, 256)
    assert (ft.mixup, ft.cutmix, ft.label_smoothing, ft.init_from) == (0.0, 0.0, 0.0, "finetune")
    cpu, _ = cli.configure(vit_train.DEFAULTS, [os.path.join(ROOT, "config", "vit_cpu.py")])
    vit_train.check_settings(cpu)
    assert cpu.dataset == "shapes" and cpu.recipe == "builtin"


# -----------------------------------------------------------------------------
# data


def write_tree(root, classes, per_class, rng, size=(11, 13)):
    """root/<class>/<i>.png with random RGB, grey or RGBA pixels (Pillow); returns {path: RGB}."""
    written = {}
    for k, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            mode = ["RGB", "L", "RGBA"][(k + i) % 3]
            pixels = rng.integers(0, 256, size + ((3,) if mode == "RGB" else (4,) if mode == "RGBA" else ()),
                                  dtype=np.uint8)
            path = os.path.join(root, name, f"{i:03d}.png")
            Image.fromarray(pixels, mode).save(path)
            rgb = np.repeat(pixels[:, :, None], 3, 2) if mode == "L" else pixels[:, :, :3]
            written[path] = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)
    return written


def test_image_folder_loader_reads_a_tree_of_pngs(tmp_path):
    rng = np.random.default_rng(0)
    classes = ["cat", "dog", "zebra"]
    written = write_tree(str(tmp_path / "train"), classes, 4, rng)
    written.update(write_tree(str(tmp_path / "val"), ["dog", "zebra"], 2, rng))  # a subset of classes
    train, val = vit_data.folder_sources(str(tmp_path), 0.1)
    assert train.classes == classes and val.classes == classes
    assert len(train) == 12 and len(val) == 4
    for src in (train, val):
        for i in range(len(src)):
            img, label = src.get(i)
            path = src.items[i]
            assert classes[label] == os.path.basename(os.path.dirname(path))
            assert torch.equal(img, written[path]), path  # PNG is lossless: decoded exactly
    flat = str(tmp_path / "flat")  # one tree: the last val_fraction of each class is held out
    write_tree(flat, ["a", "b"], 10, rng)
    train, val = vit_data.folder_sources(flat, 0.2)
    assert len(train) == 16 and len(val) == 4
    assert [os.path.basename(p) for p in val.items] == ["008.png", "009.png"] * 2


def test_training_on_an_image_folder(tmp_path):
    rng = np.random.default_rng(1)
    write_tree(str(tmp_path / "data" / "train"), ["a", "b"], 8, rng, size=(16, 16))
    write_tree(str(tmp_path / "data" / "val"), ["a", "b"], 2, rng, size=(16, 16))
    out = str(tmp_path / "out")
    train(["--dataset=folder", f"--data_dir={tmp_path / 'data'}", f"--out_dir={out}", "--img_size=16",
                    "--patch_size=4", "--n_layer=1", "--n_head=2", "--n_embd=16", "--batch_size=8", "--max_iters=2",
                    "--eval_interval=2", "--crop_scale=(0.5, 1.0)", "--dtype=float32", "--device=cpu"])
    ck = checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")
    assert ck["classes"] == ["a", "b"] and ck["iter_num"] == 2 and ck["model_args"]["num_classes"] == 2


def test_shapes_dataset_is_deterministic_and_balanced():
    x1, y1 = vit_data.make_shapes(200, 16, 10, seed=3)
    x2, y2 = vit_data.make_shapes(200, 16, 10, seed=3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, vit_data.make_shapes(200, 16, 10, seed=4)[0])
    assert torch.bincount(y1).tolist() == [20] * 10
    assert x1.shape == (200, 3, 16, 16) and x1.dtype == torch.uint8
    assert x1.float().std((1, 2, 3)).min() > 5  # every image has content


def test_train_batches_cover_epochs_resume_and_do_not_depend_on_world_size():
    one = iter(vit_data.TrainBatches(20, 4, 0, 1, seed=5))
    first = [next(one) for _ in range(12)]
    assert sorted(i for b in first[:5] for _, _, i in b) == list(range(20))  # an epoch sees every image once
    assert {e for b in first[5:10] for e, _, _ in b} == {1}
    later = iter(vit_data.TrainBatches(20, 4, 0, 1, seed=5, start=7))
    assert [next(later) for _ in range(5)] == first[7:12]  # starting at step 7 = skipping 7
    ranks = [iter(vit_data.TrainBatches(20, 4, r, 2, seed=5)) for r in (0, 1)]
    two = [next(ranks[m % 2]) for m in range(4)]  # global micro-batch m is rank m % 2's
    assert two == first[:4]


# -----------------------------------------------------------------------------
# the built-in recipe


def test_mixup_and_cutmix_targets_match_the_mixed_images():
    rng = np.random.default_rng(0)
    B, K = 6, 5
    x = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1).expand(B, 3, 8, 8).contiguous()
    target = vit_data.smooth_targets(torch.arange(B) % K, K, 0.1)
    assert torch.allclose(target.sum(1), torch.ones(B))  # rows are distributions
    xm, tm, lam = vit_data.mix_batch(x, target, rng, mixup_alpha=0.0, cutmix_alpha=1.0, prob=1.0)
    own = (xm == x).float().mean((1, 2, 3))  # share of each image's own pixels
    assert torch.allclose(own[:2], torch.full((2,), lam))
    assert torch.allclose(tm, lam * target + (1 - lam) * target.flip(0))
    xm, tm, lam = vit_data.mix_batch(x, target, rng, mixup_alpha=0.8, cutmix_alpha=0.0, prob=1.0)
    assert torch.allclose(xm[:, 0, 0, 0], lam * x[:, 0, 0, 0] + (1 - lam) * x.flip(0)[:, 0, 0, 0])
    xm, tm, lam = vit_data.mix_batch(x, target, rng, mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0)
    assert lam == 1.0 and xm is x and tm is target  # switched off


def test_random_resized_crops_stay_inside_and_depend_only_on_the_key():
    rng = np.random.default_rng(0)
    for H, W in [(32, 32), (20, 50), (50, 20)]:
        for _ in range(200):
            top, left, h, w = vit_data.random_resized_crop_box(H, W, (0.25, 1.0), rng)
            assert 0 <= top and top + h <= H and 0 <= left and left + w <= W and h > 0 and w > 0
            assert h * w >= 0.2 * H * W  # 0.25 less the rounding of h and w on these small images
    src = vit_data.Source(*vit_data.make_shapes(4, 32, 10, 0), vit_data.SHAPES)
    view = vit_data.View(src, settings(img_size=24, crop_scale=(0.3, 1.0)), train=True)
    assert view[(0, 1, 1)][0].shape == (3, 24, 24)
    assert torch.equal(view[(0, 1, 1)][0], view[(0, 1, 1)][0])
    assert not torch.equal(view[(0, 1, 1)][0], view[(1, 1, 1)][0])  # the same image in the next epoch


# -----------------------------------------------------------------------------
# the paper's recipe through timm (only where timm imports: see the README)


def test_paper_recipe_through_timm(tmp_path):
    """A few steps of recipe="paper" on 32 images: timm's transforms (RandAugment, random
    erasing, bicubic), repeated augmentation and Mixup run, the run is repeatable and resumes
    exactly."""
    pytest.importorskip("timm", reason="timm is an optional extra (pip install timm); not installed here")
    try:
        train_tf, eval_tf = vit_data.timm_transforms(settings(img_size=32, dataset="shapes"))
    except cli.UserError as e:  # timm <= 1.0.31 with Pillow >= 13 (README): say so, do not hide it
        pytest.skip(str(e))
    text = repr(train_tf)
    assert "RandAugment" in text and "RandomErasing" in text and "bicubic" in text.lower(), text
    assert "36" in repr(eval_tf) and "CenterCrop" in repr(eval_tf)  # 32 / 0.875 -> 36, centre 32
    args = ["--recipe=paper", "--shapes_train_size=32", "--shapes_val_size=8", "--img_size=32", "--patch_size=8",
            "--n_layer=1", "--n_head=2", "--n_embd=16", "--batch_size=8", "--eval_interval=1", "--dtype=float32",
            "--device=cpu", "--warmup_iters=1", "--lr_decay_iters=4"]
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train(args + [f"--out_dir={a}", "--max_iters=4"])
    train(args + [f"--out_dir={b}", "--max_iters=2"])
    train(args + [f"--out_dir={b}", "--max_iters=4", "--init_from=resume"])
    assert [i for i, _ in losses(a)] == [0, 1, 2, 3, 4]
    assert all(math.isfinite(l) for _, l in losses(a)[1:])
    assert losses(a) == losses(b)
    batches = vit_data.TrainBatches(32, 8, 0, 1, seed=0, repeats=3)  # timm's RepeatAugSampler
    keys = [i for b in [next(iter(batches))] for _, _, i in b]
    assert len(set(keys)) < len(keys)  # copies of an image in one epoch


# -----------------------------------------------------------------------------
# seeing inside


@pytest.fixture(scope="module")
def inspected(trained, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inspect"))
    report = vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--out_dir={out}", "--n_show=2", "--layers=1,2",
                               "--n_rvar=24", "--batch_size=10"])
    return out, report


def test_inspect_writes_the_pictures(inspected):
    out, report = inspected
    expected = {"rvar.png", "pi_00.png", "pi_01.png", "cls_attn_00.png", "cls_attn_01.png"}
    assert set(report["files"]) == expected
    assert {f for f in os.listdir(out) if f.endswith(".png")} == expected
    for name in expected:
        with Image.open(os.path.join(out, name)) as im:
            assert im.format == "PNG" and im.width > 300 and im.height > 150, (name, im.size)
            # not a blank canvas: matplotlib drew something
            assert np.asarray(im.convert("L")).std() > 10, name
    assert all(e["true"] in vit_data.SHAPES for e in report["images"])


def test_inspect_rvar_equals_compression_objective_on_the_same_tensors(trained, inspected):
    _, report = inspected
    model, ck = loading.load_vit_model(os.path.join(trained, "ckpt.pt"))
    model.eval()
    T = settings(**ck["config"])
    for split, src in zip(("train", "val"), vit_data.build_sources(T)):
        rec = report["rvar"][split]
        view = vit_data.View(src, T, train=False)
        x = (torch.stack([view[i][0] for i in rec["indices"]]).float() / 255 - 0.5) / 0.5  # shapes normalisation
        with torch.no_grad():
            maps = {}
            model(x, record=maps)
            before, after = [], []
            for block, m in zip(model.blocks, maps["layers"]):
                B, N, C = m["z"].shape
                before.append(compression_objective(m["w"], m["pi"]).double().mean())
                z_after = m["z"] + block.attn_scale.weight * m["out"]  # the step, through the layer scale
                w_after = block.attn.w_proj(z_after).view(B, N, 4, C // 4).transpose(1, 2)
                after.append(compression_objective(w_after, m["pi"]).double().mean())
        assert len(rec["indices"]) == 24 and len(set(rec["indices"])) == 24
        # rtol 1e-5: the same fp32 operations, batched 10 at a time there and 24 at once here,
        # which can change matmul blocking (fp32 rounding ~1e-7 relative, a few ops deep)
        assert np.allclose(rec["before"], before, rtol=1e-5, atol=0), (split, rec["before"], before)
        assert np.allclose(rec["after"], after, rtol=1e-5, atol=0), (split, rec["after"], after)


def test_within_layer_check_sees_a_tied_gradient_step_lower_r_var():
    """Tie each block's output map to the theory's (c_proj = (tau/N) U, MATH.md §2.5, no bias,
    layer scale 1): every step must lower R_var; the negated step must raise it."""
    torch.manual_seed(0)
    model = ToSTViT(ViTConfig(img_size=16, patch_size=4, n_layer=2, n_head=4, n_embd=32, num_classes=3)).eval()
    x = torch.randn(6, 3, 16, 16)
    N, tau = (16 // 4) ** 2, 0.5
    for sign, lowered in ((1.0, True), (-1.0, False)):
        with torch.no_grad():
            for block in model.blocks:
                block.attn.c_proj.weight.copy_(sign * tau / N * block.attn.w_proj.weight.T)
                block.attn.c_proj.bias.zero_()
                block.attn_scale.weight.fill_(1.0)
        before, after = vit_inspect.rvar_before_after(model, x)[:2]  # (6, 2) each
        assert bool(((after < before) if lowered else (after > before)).all()), (sign, before, after)


def test_inspect_on_a_folder_of_images(trained, tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "pics"
    folder.mkdir()
    for i in range(3):  # sizes other than the model's: centre-cropped and resized to 16
        Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    out = str(tmp_path / "out")
    report = vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--images={folder}", f"--out_dir={out}",
                               "--layers=2", "--n_rvar=4"])
    assert [e["source"] for e in report["images"]] == [str(folder / f"p{i}.png") for i in range(3)]
    assert report["layers_shown"] == [2]
    assert all(e["true"] is None and e["predicted"] in vit_data.SHAPES[:4] for e in report["images"])
    assert all(os.path.isfile(os.path.join(out, f"pi_{i:02d}.png")) for i in range(3))
    with pytest.raises(cli.ConfigError, match="out of range"):
        vit_inspect.main([f"--ckpt={trained}/ckpt.pt", f"--out_dir={out}", "--layers=3"])


def test_new_run_refuses_an_out_dir_that_holds_a_checkpoint(tmp_path):
    """As train.py and lra/train.py: a scratch run into a finished run's out_dir stops with one
    line and leaves its checkpoint and log untouched."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"an earlier run")
    (out / "log.jsonl").write_text('{"iter": 0}\n')
    with pytest.raises(cli.UserError, match="init_from=resume"):
        train(["--shapes_train_size=32", "--shapes_val_size=8", "--device=cpu", f"--out_dir={out}"])
    assert (out / "ckpt.pt").read_bytes() == b"an earlier run" and (out / "log.jsonl").read_text() == '{"iter": 0}\n'


# -----------------------------------------------------------------------------
# image modes: every pixel format Pillow opens keeps its information, or is refused


@pytest.mark.parametrize("mode", ["L", "I;16", "I", "RGB", "RGBA", "LA", "P", "CMYK", "1"])
def test_every_image_mode_decodes_to_what_it_shows(mode, tmp_path):
    """A horizontal grey ramp saved in each mode decodes to uint8 (3, H, W) whose grey levels
    follow the ramp: deeper-than-8-bit greyscale (16-bit PNGs open as I;16 or I) is scaled from
    0..65535 to 0..255, exactly (round half up), not clipped to white as convert("RGB") would."""
    ramp = np.tile(np.linspace(0, 1, 32), (8, 1))  # (H, W) in [0, 1]
    if mode in ("I;16", "I"):  # a 16-bit PNG; a 32-bit integer TIFF (PNG cannot hold mode I)
        values = np.round(ramp * 65535).astype(np.uint16 if mode == "I;16" else np.int32)
        im = Image.fromarray(values)
        expected = (values.astype(np.int64) * 255 + 32767) // 65535
    else:
        im = Image.fromarray(np.round(ramp * 255).astype(np.uint8)).convert(mode)
        expected = np.asarray(im.convert("L"), dtype=np.int64)
    path = str(tmp_path / ("img.tif" if mode in ("CMYK", "I") else "img.png"))
    im.save(path)
    with Image.open(path) as back:
        assert back.mode == mode  # the file holds the mode under test
    got = vit_data.load_image(path)
    assert got.dtype == torch.uint8 and got.shape == (3, 8, 32)
    grey = got.double().mean(0).numpy()
    if mode in ("I;16", "I"):
        assert np.array_equal(got[0].numpy(), expected) and got.max() == 255  # the ramp, full range
    elif mode != "1":  # (1-bit: a threshold of the ramp, dark then bright)
        assert np.abs(grey - expected).max() <= 2  # the same grey levels (palette and CMYK round a little)
    assert grey[:, 0].max() < grey[:, -1].min()  # dark on the left, bright on the right: no clipping


def test_out_of_range_integer_pixels_are_refused(tmp_path):
    im = Image.fromarray(np.full((4, 4), 70000, dtype=np.int32))
    path = str(tmp_path / "big.tif")
    im.save(path)
    with pytest.raises(cli.UserError, match="outside 0..65535"):
        vit_data.load_image(path)
