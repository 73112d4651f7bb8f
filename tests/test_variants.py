"""
Tests of the linear-attention baseline and the opt-in ToST variants (short_conv, hybrid_every),
and of the recall suite's data (results/recall/). CPU only, offline, tiny models; about 20 s.

    python -m pytest -q tests/test_variants.py

Decoding: for every variant, the logits of a parallel forward equal those of a prefill then
one token at a time from the decoding state (float64). The maths: the chunked causal linear
attention against a direct double loop, the short convolution against its definition, the
non-causal linear attention's padding mask. The settings: train.py trains with each new
setting and refuses a bad one in one line. The recall suite: keys and values disjoint, the
targets exactly the answers, chance computed from the format; a --quick run sweeps, selects,
continues from its file and refuses one of other settings; bad lists end in one line; the
state bytes follow the formulas; no output default is a committed file (issue 26, class 6).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import prepare_char  # noqa: E402
import train  # noqa: E402
from lra.encoder import LRAClassifier, LRAConfig  # noqa: E402
from model import (GPT, LINEAR_CHUNK, GPTConfig, LinearAttention, SoftmaxAttention, TSSA,  # noqa: E402
                   causal_linear_attention, elu_feature_map)
from results.recall import decode_bench, suite, tasks  # noqa: E402
from results import recall_tables  # noqa: E402
from nanotost import checkpoints, cli  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is fastest, and steady on a shared machine

VARIANTS = {  # name -> GPTConfig fields
    "linear": dict(attn="linear"),
    "tost_conv": dict(attn="tssa", short_conv=4),
    "hybrid": dict(attn="tssa", hybrid_every=2),
    "linear_hybrid": dict(attn="linear", hybrid_every=2),
    "tost_conv_hybrid": dict(attn="tssa", short_conv=3, hybrid_every=3),
}


def tiny_gpt(block_size=96, n_layer=3, **kw):
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=block_size, vocab_size=40, n_layer=n_layer, n_head=2, n_embd=16,
                      layer_scale_init=1.0, **kw)).double().eval()
    with torch.no_grad():  # the short convolution starts as the identity: make it a real mixing of 4 tokens
        for block in m.blocks:
            if getattr(block.attn, "conv", None) is not None:
                block.attn.conv.weight.normal_()
    return m


# -----------------------------------------------------------------------------
# decoding = parallel forward


@pytest.mark.parametrize("name", VARIANTS)
def test_decoding_state_gives_the_parallel_logits(name):
    """Prefill 7 tokens, then 83 one at a time (T = 90 > LINEAR_CHUNK: several chunks)."""
    m = tiny_gpt(**VARIANTS[name])
    idx = torch.randint(0, 40, (2, 90))
    assert idx.shape[1] > LINEAR_CHUNK
    with torch.no_grad():
        parallel, _ = m(idx)  # (B, T, V): every position
        state = m.init_state(2)
        steps = [m.prefill(idx[:, :7], state)]
        steps += [m.step(idx[:, t:t + 1], state) for t in range(7, 90)]
    # float64 throughout; the two forms sum in different orders: agree to rounding (1e-10 on O(1) logits)
    torch.testing.assert_close(torch.stack(steps, dim=1), parallel[:, 6:], rtol=0, atol=1e-10)
    assert state.pos == 90


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_generate_equals_full_reforward(name):
    m = tiny_gpt(block_size=32, n_layer=2, **VARIANTS[name]).float()
    prompt = torch.randint(0, 40, (2, 5))
    fast = m.generate(prompt, max_new_tokens=20, temperature=0)
    slow = prompt
    with torch.no_grad():
        for _ in range(20):
            logits, _ = m(slow)
            slow = torch.cat([slow, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(fast, slow)


def test_generate_past_block_size_keeps_going():
    """Linear attention and the conv variant decode past block_size from their states; a hybrid
    (it has softmax blocks) slides a window, as the softmax baseline."""
    for kw in (dict(attn="linear"), dict(attn="tssa", short_conv=4), dict(attn="tssa", hybrid_every=2)):
        m = tiny_gpt(block_size=8, n_layer=2, **kw).float()
        out = m.generate(torch.randint(0, 40, (1, 3)), max_new_tokens=15, temperature=0)
        assert out.shape == (1, 18)


def test_hybrid_layout_and_state_kinds():
    m = tiny_gpt(n_layer=6, attn="tssa", hybrid_every=3)
    kinds = [type(b.attn) for b in m.blocks]
    assert kinds == [TSSA, TSSA, SoftmaxAttention, TSSA, TSSA, SoftmaxAttention]  # (i + 1) % 3 == 0
    state = m.init_state(1)
    m.prefill(torch.zeros(1, 10, dtype=torch.long), state)
    # KV caches (of block_size tokens) for the softmax blocks only
    assert [type(s).__name__ for s in state.layers] == ["TSSAState", "TSSAState", "KVCache"] * 2
    assert state.pos == 10 and state.layers[2].k.shape[2] == m.config.block_size


def test_linear_state_has_constant_size():
    m = tiny_gpt(attn="linear")
    state = m.init_state(3)
    before = [s.nbytes() for s in state.layers]
    m.prefill(torch.zeros(3, 50, dtype=torch.long), state)
    H, p = 2, 8
    assert [s.nbytes() for s in state.layers] == before == [3 * (H * p * p + H * p) * 8] * 3  # float64 here
    assert state.pos == 50


# -----------------------------------------------------------------------------
# the maths, against direct computations


def test_chunked_causal_linear_attention_matches_the_definition():
    """y_t = sum_{s<=t} (phi(q_t).phi(k_s)) v_s / (sum_{s<=t} phi(q_t).phi(k_s) + eps), by a double
    loop, for T not a multiple of the chunk, and continued from earlier sums."""
    torch.manual_seed(1)
    B, H, T, p = 2, 3, 45, 4
    q, k = (elu_feature_map(torch.randn(B, H, T, p, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(B, H, T, p, dtype=torch.float64)
    y, (S, z) = causal_linear_attention(q, k, v, chunk=8)
    ref = torch.zeros_like(v)
    for t in range(T):
        a = (q[:, :, t:t + 1] * k[:, :, :t + 1]).sum(-1)  # (B, H, t + 1)
        ref[:, :, t] = (a[..., None] * v[:, :, :t + 1]).sum(2) / (a.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)  # float64, sums of 45 terms
    torch.testing.assert_close(S, k.transpose(-1, -2) @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(z, k.sum(2), rtol=1e-12, atol=1e-12)
    # the second half continued from the first half's sums = the second half of the whole
    _, (S1, z1) = causal_linear_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], chunk=8)
    y2, _ = causal_linear_attention(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], S1, z1, chunk=8)
    torch.testing.assert_close(y2, ref[:, :, 20:], rtol=1e-12, atol=1e-12)


def test_short_conv_is_a_causal_depthwise_convolution_and_starts_as_identity():
    cfg = GPTConfig(block_size=16, n_embd=6, n_head=2, short_conv=3)
    torch.manual_seed(2)
    attn = TSSA(cfg, causal=True).double()
    x = torch.randn(2, 10, 6, dtype=torch.float64)
    y = attn.conv(x)
    assert torch.equal(y, x)  # identity at initialisation: the variant starts as the paper's TSSA
    with torch.no_grad():
        attn.conv.weight.normal_()
    state = attn.init_state(2, torch.zeros((), dtype=torch.long))
    y = attn.conv(x, state)
    past = state.conv
    a = attn.conv.weight  # (C, k): column k - 1 multiplies x_t, column k - 1 - j multiplies x_{t-j}
    ref = torch.stack([sum(a[:, 2 - j] * x[:, t - j] for j in range(3) if t - j >= 0) for t in range(10)], dim=1)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(past, x[:, -2:])  # the decoding state: the last k - 1 inputs


def test_linear_noncausal_ignores_padding():
    """Through the whole LRA classifier (pre-norm blocks, masked pooling): the same sequences with
    0 or 9 junk tokens after them give the same outputs at every real token and the same logits."""
    torch.manual_seed(3)
    model = LRAClassifier(LRAConfig(vocab_size=20, num_classes=3, max_len=40, attn="linear", dropout=0.0)).eval()
    tokens = torch.randint(1, 20, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False  # the second sequence is 8 tokens long
    junk = torch.randint(1, 20, (2, 9))
    padded, pmask = torch.cat([tokens, junk], 1), torch.cat([mask, torch.zeros(2, 9, dtype=torch.bool)], 1)
    with torch.no_grad():
        feats, _ = model.encoder(tokens, mask)
        feats_p, _ = model.encoder(padded, pmask)
        logits, logits_p = model([(tokens, mask)]), model([(padded, pmask)])
    # float32, the same sums over real tokens with zeros added: equal to 1e-6
    torch.testing.assert_close(feats_p[:, :12][mask], feats[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits_p, logits, rtol=1e-5, atol=1e-6)
    attn = LinearAttention(LRAConfig(vocab_size=2, num_classes=2, max_len=4, n_embd=8, n_head=2, bias=False), causal=False)
    assert (attn(torch.randn(2, 21, 8), mask=pmask)[~pmask] == 0).all()  # padded tokens: no output


def test_variant_settings_are_checked():
    with pytest.raises(ValueError, match="short_conv"):
        GPT(GPTConfig(block_size=8, vocab_size=10, n_layer=1, n_head=2, n_embd=8, attn="softmax", short_conv=4))
    with pytest.raises(ValueError, match=">= 0"):
        GPT(GPTConfig(block_size=8, vocab_size=10, n_layer=1, n_head=2, n_embd=8, hybrid_every=-1))


# -----------------------------------------------------------------------------
# train.py with each new setting


@pytest.fixture(scope="module")
def char_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    text = root / "t.txt"
    text.write_text("Return the sum of the values, or None when there are none. " * 400)
    prepare_char.main([f"--input={text}", f"--data_dir={root / 'data'}", "--name=t_char"])
    return root


@pytest.mark.parametrize("extra", [["--attn=linear"], ["--short_conv=4"], ["--hybrid_every=2"],
                                   ["--attn=linear", "--hybrid_every=2"]])
def test_train_py_runs_each_variant(char_data, extra, capsys):
    out = char_data / ("out" + "".join(extra).replace("-", "_").replace("=", ""))
    args = ["--dataset=t_char", f"--data_dir={char_data / 'data'}", f"--out_dir={out}", "--n_layer=2", "--n_head=2",
            "--n_embd=16", "--block_size=16", "--batch_size=4", "--gradient_accumulation_steps=1", "--eval_iters=2",
            "--max_iters=6", "--eval_interval=6", "--warmup_iters=1", "--learning_rate=1e-2", "--num_threads=1",
            "--device=cpu", "--dtype=float32", *extra]
    model = train.main(args)
    for arg in extra:
        key, value = arg[2:].split("=")
        assert str(getattr(model.config, key)) == value
    ckpt = checkpoints.load_checkpoint(str(out / "ckpt.pt"), "language")
    reloaded = GPT(GPTConfig(**ckpt["model_args"]))  # what sample.py does
    reloaded.load_state_dict(ckpt["model"])
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("bad, says", [(["--short_conv=4", "--attn=softmax"], "short_conv"),
                                        (["--attn=performer"], "attn must be one of"),
                                        (["--hybrid_every=-2"], "hybrid_every must not be negative")])
def test_train_py_refuses_bad_variant_settings(char_data, bad, says):
    with pytest.raises(cli.UserError, match=says):
        train.main(["--dataset=t_char", f"--data_dir={char_data / 'data'}", "--device=cpu", *bad])


# -----------------------------------------------------------------------------
# the recall suite's data and a quick run


def test_mqar_keys_values_disjoint_and_targets_are_the_values():
    x, y = tasks.mqar(batch=64, n_pairs=6, n_queries=10, n_keys=20, n_values=30, seed=5)
    lay = tasks.mqar_layout(20, 30)
    assert x.shape == y.shape == (64, 32) and lay.vocab_size == 51
    keys, vals = x[:, 0:12:2], x[:, 1:12:2]
    assert ((keys >= 1) & (keys < 21)).all() and ((vals >= 21) & (vals < 51)).all()  # disjoint ranges
    for b in range(64):
        assert len(set(keys[b].tolist())) == 6 and len(set(vals[b].tolist())) == 6  # distinct pairs
        bound = dict(zip(keys[b].tolist(), vals[b].tolist()))
        scored = (y[b] != -1).nonzero().flatten().tolist()
        assert scored == list(range(12, 32, 2))  # the query keys, nothing else
        for t in scored:  # the target is the value bound to the query key, which is the next input
            assert y[b, t].item() == bound[x[b, t].item()] == x[b, t + 1].item()
    assert tasks.chance("mqar", n_pairs=6) == pytest.approx(1 / 6)


def test_copy_and_niah_targets():
    x, y = tasks.copy(batch=8, length=5, n_tokens=9, seed=1)
    assert (x[:, 5] == 0).all() and torch.equal(x[:, :5], x[:, 6:])
    assert torch.equal(y[:, 5:10], x[:, :5]) and (y[:, :5] == -1).all() and (y[:, 10] == -1).all()
    x, y = tasks.niah(batch=50, length=30, n_tokens=12, seed=2)
    assert ((x == 0).sum(1) == 2).all() and (x[:, -1] == 0).all()  # the marker: the needle and the query
    needle = (x[:, :-1] == 0).float().argmax(1)
    assert torch.equal(y[:, -1], x[torch.arange(50), needle + 1]) and ((y[:, :-1] == -1).all())
    assert tasks.chance("niah", n_tokens=12) == tasks.chance("copy", n_tokens=12) == pytest.approx(1 / 12)
    x, _ = tasks.niah(batch=4, length=30, n_tokens=12, seed=2, depth=0.0)
    assert (x[:, 0] == 0).all()  # depth 0: the needle opens the haystack


def quick_suite(tmp_path, *extra):
    """A --quick run of two models into tmp_path; (its data, its printed output)."""
    argv = ["--quick=True", "--models=softmax,tost", f"--out_json={tmp_path / 'r.json'}",
            f"--figure={tmp_path / 'r.png'}", *extra]
    return suite.main(argv)


def test_suite_quick_run_sweeps_selects_and_continues(tmp_path, capsys):
    data = quick_suite(tmp_path)
    # the sweep: both recipes x both models x the two quick rates on seed 0; then seed 1 at the selected rate
    sweep = {(r["recipe"], r["model"], r["lr"]) for r in data["runs"] if r["seed"] == 0}
    assert sweep == {(rec, m, lr) for rec in ("tuned", "plain") for m in ("softmax", "tost") for lr in (1e-3, 1e-2)}
    for rec in ("tuned", "plain"):
        for m in ("softmax", "tost"):
            lr = data["selected"][rec][m]
            [follow] = [r for r in data["runs"] if (r["recipe"], r["model"], r["seed"]) == (rec, m, 1)]
            assert follow["lr"] == lr  # seed 1 runs at the rate seed 0 selected
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["runs"] == data["runs"] and saved["chance"]["mqar"] == pytest.approx(1 / 4)  # quick MQAR: 4 pairs
    assert (tmp_path / "r.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "recall_summary:" in out and "| softmax attention |" in out
    # a rerun trains nothing: every run is in the file, and the file is the same
    again = quick_suite(tmp_path)
    assert again["runs"] == data["runs"]
    assert "tuned sweep: 4 of 4 runs already in" in capsys.readouterr().out
    # more tasks later: copy at the rates the MQAR sweep selected, the MQAR runs kept
    more = quick_suite(tmp_path, "--recipes=tuned", "--tasks=mqar,copy")
    copies = [r for r in more["runs"] if r["task"] == "copy"]
    assert {(r["model"], r["lr"]) for r in copies} == {(m, data["selected"]["tuned"][m]) for m in ("softmax", "tost")}
    assert more["runs"][:len(data["runs"])] == data["runs"]


def test_suite_selection_best_validation_then_fewer_steps_then_smaller_rate():
    run = lambda lr, val, steps, model="m", seed=0: dict(recipe="tuned", model=model, task="mqar", lr=lr,  # noqa: E731
                                                        seed=seed, val_acc=val, steps=steps)
    data = dict(runs=[run(1e-3, 0.5, 300), run(3e-3, 0.9, 300), run(1e-2, 0.9, 300), run(3e-2, 0.2, 100),
                      run(1e-3, 1.0, 100, seed=1),  # another seed never selects
                      run(1e-3, 0.99, 250, "n"), run(3e-3, 0.99, 200, "n")])
    assert suite.selected_rates(data, "mqar") == {"tuned": {"m": 3e-3, "n": 3e-3}}


def test_suite_state_bytes_per_layer_follow_the_formulas():
    C, _ = cli.configure(suite.SETTINGS, ["--n_embd=32", "--n_head=4", "--mqar_pairs=4", "--mqar_queries=4"])
    task = suite.Task("mqar", C)  # T = 16
    T, Cw, H, p = 16, 32, 4, 8
    expect = {"tost": 2 * Cw + H, "tost_conv": 2 * Cw + H + 3 * Cw, "linear": H * p * p + H * p,
              "softmax": 2 * T * Cw, "hybrid_conv": ((2 * Cw + H + 3 * Cw) + 2 * T * Cw) / 2}
    for name, floats in expect.items():
        model = suite.build_model(name, "plain", task, C)
        assert suite.state_bytes_per_layer(model, task) == 4 * floats, name  # fp32: exact integers


@pytest.mark.parametrize("bad, says", [
    ("--models=", "models must be names separated by commas"),
    ("--tasks=", "tasks must be names separated by commas"),
    ("--recipes= ,", "recipes must be names separated by commas"),
    ("--models=softmax,performer", "models: unknown 'performer'; choose from softmax"),
    ("--tasks=mqar,bogus", "tasks: unknown 'bogus'"),
    ("--models=tost,tost", "models names tost more than once"),
    ("--learning_rates=", "learning_rates must be numbers separated by commas"),
    ("--learning_rates=1e-3,fast", "learning_rates must be numbers"),
    ("--learning_rates=0,1e-3", "learning_rates must be one or more rates in \\(0, 1\\)"),
    ("--seeds=0", "seeds must be at least 1"),
    ("--out_json=", "out_json must name a file"),
])
def test_suite_refuses_bad_lists_in_one_line(tmp_path, bad, says):
    with pytest.raises(cli.UserError, match=says):
        suite.main(["--quick=True", bad, f"--figure={tmp_path / 'r.png'}"] +
                   ([] if bad.startswith("--out_json") else [f"--out_json={tmp_path / 'r.json'}"]))
    assert not (tmp_path / "r.json").exists()


def test_suite_empty_models_is_one_line_from_the_command_line(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "results", "recall", "suite.py"), "--models=",
                           f"--out_json={tmp_path / 'r.json'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "results/recall/suite.py: models must be names separated by commas (choose from softmax, linear, tost, tost_uniform, "
        "tost_conv, hybrid, hybrid_conv), got ''"]


def test_suite_refuses_a_file_of_other_settings(tmp_path):
    quick_suite(tmp_path, "--recipes=tuned", "--models=tost")
    before = (tmp_path / "r.json").read_bytes()
    with pytest.raises(cli.UserError, match="holds runs of other settings \\(n_embd: 32 there, 48 here\\)"):
        quick_suite(tmp_path, "--recipes=tuned", "--models=tost", "--n_embd=48")
    assert (tmp_path / "r.json").read_bytes() == before  # nothing mixed, nothing lost


def git_tracked_or_not_ignored(path):
    """Why `path` (relative to the repository) would be a bad output default, or None."""
    if subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=REPO, capture_output=True).returncode == 0:
        return "tracked by git"
    if subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True).returncode != 0:
        return "not ignored by git"
    return None


@pytest.mark.parametrize("script, key", [(suite, "out_json"), (suite, "figure"), (decode_bench, "out")])
def test_recall_output_defaults_are_ignored_files_not_committed_results(script, key):
    """Smoke runs and reruns never overwrite committed results (issue 26, class 6): every
    default output, and the quick run's, is a git-ignored path; the README's commands name
    the committed files."""
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("not a git checkout: nothing to compare the defaults with")
    defaults = [script.SETTINGS[key]] + ([suite.QUICK[key]] if script is suite else [])
    for path in defaults:
        assert path and git_tracked_or_not_ignored(path) is None, (path, git_tracked_or_not_ignored(path))
    readme = open(os.path.join(REPO, "results", "recall", "README.md"), encoding="utf-8").read()
    committed = {"out_json": "results/recall/results_cpu.json", "figure": "results/recall/recall.png", "out": "results/recall/decode_cpu.json"}
    assert f"--{key}={committed[key]}" in readme  # the README's command names the committed file
    assert git_tracked_or_not_ignored(committed[key]) == "tracked by git"


def test_decode_bench_counts_the_filled_part_of_a_kv_cache(tmp_path):
    rows = decode_bench.main(["--T=8,24", "--steps=2", "--repeats=1", f"--out={tmp_path / 'd.json'}"])
    size = {(r["variant"], r["T"]): r["state_bytes_per_sequence"] for r in rows}
    C, H = 96, 4  # the pydocs layout
    for T in (8, 24):
        assert size[("tost", T)] == 6 * (2 * C + H) * 4  # 6 layers of 2C + H fp32 numbers, whatever T
        assert size[("tost_conv", T)] == 6 * (2 * C + H + 3 * C) * 4
        assert size[("linear", T)] == 5 * (H * (C // H) ** 2 + C) * 4
        assert size[("softmax", T)] == 5 * 2 * T * C * 4  # the T filled positions of 5 caches
        assert size[("hybrid", T)] == 3 * (2 * C + H) * 4 + 3 * 2 * T * C * 4
    saved = json.loads((tmp_path / "d.json").read_text())
    assert saved["rows"] == rows and "softmax" in recall_tables.table_decode(saved)
