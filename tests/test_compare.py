"""
Tests of the first screen's comparison (results/compare/pydocs.py) and its README table
(results/pydocs_tables.py). CPU only, offline; 1.5 to 4 min on a shared 2-core machine (load average 3-7),
most of it the --quick run (four Python processes: the calibration, train.py, evaluate.py, sample.py).

    python -m pytest -q tests/test_compare.py

What the prefix statistics carry (MATH.md §4.6: sign-free, order-free with uniform Pi; the short
convolution adds order); the word share on made-up text (whole words, case, 4+ letters); samples cut out of sample.py's
output by length; the counting models against a direct count; the equal-time iteration counts
from a calibration; bad settings refused in one line; --quick end to end on a small corpus (a
calibration, a run, the JSON, the table, the figure; run again, nothing is retrained); and the
README's table equals its rendering from the committed JSON.
"""

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import prepare_char  # noqa: E402
from results.compare import pydocs  # noqa: E402
from model import TSSA, GPTConfig, causal_tssa  # noqa: E402
from results import pydocs_tables  # noqa: E402
from nanotost import cli  # noqa: E402

# -----------------------------------------------------------------------------
# the lesson (MATH.md §4.6): what the prefix statistics carry of the tokens before j


def test_prefix_statistics_are_sign_free_and_with_uniform_pi_order_free():
    torch.manual_seed(0)
    w = torch.randn(2, 3, 9, 4, dtype=torch.float64)  # (B, H, T, p); token j = 8 is the last
    temp, bias = torch.ones(3, dtype=torch.float64), torch.randn(3, 9, dtype=torch.float64)
    last = lambda w, mode="softmax": causal_tssa(w, temp, bias, pi_mode=mode)[:, :, 8]  # noqa: E731
    signs = torch.where(torch.rand(2, 3, 8, 4) < 0.5, -1.0, 1.0).double()
    flipped = torch.cat([w[:, :, :8] * signs, w[:, :, 8:]], dim=2)  # the earlier tokens' features, signs flipped
    assert torch.equal(last(flipped), last(w))  # only squares of them reach token j: exactly the same
    order = torch.cat([torch.randperm(8), torch.tensor([8])])
    shuffled = w[:, :, order]  # the earlier tokens in another order
    # uniform Pi: the statistics are plain prefix sums, order-free (cumsum rounding: 1e-12)
    torch.testing.assert_close(last(shuffled, "uniform"), last(w, "uniform"), rtol=1e-12, atol=1e-12)
    # softmax Pi: order enters only through each earlier token's weight Pi_t (its own prefix, its position)
    assert not torch.allclose(last(shuffled), last(w), rtol=1e-6, atol=1e-6)


def test_short_conv_gives_token_j_the_order_of_the_tokens_just_before_it():
    torch.manual_seed(0)
    x = torch.randn(2, 9, 8, dtype=torch.float64)  # (B, T, C)
    swapped = x[:, [0, 1, 2, 3, 4, 5, 7, 6, 8]]  # the two tokens before the last, exchanged
    for k, order_free in ((0, True), (4, False)):
        layer = TSSA(GPTConfig(block_size=9, n_embd=8, n_head=2, pi="uniform", short_conv=k), causal=True).double()
        if k:
            with torch.no_grad():
                layer.conv.weight.normal_()  # a learned kernel (it starts as the identity)
        same = torch.allclose(layer(swapped)[:, 8], layer(x)[:, 8], rtol=1e-12, atol=1e-12)
        assert same == order_free


# -----------------------------------------------------------------------------
# the word share


def test_word_share_counts_whole_words_of_four_letters_or_more_with_their_case():
    corpus = pydocs.corpus_words("Return the value of a string.\nstrings: see Value_error (value)")
    assert corpus == {"Return", "the", "value", "of", "a", "string", "strings", "see", "Value", "error"}
    samples = ["Return valu the strin value2 strings", "RETURN xvalue ofa Value"]
    # runs of 4+ letters: Return, valu, strin, value, strings | RETURN, xvalue, Value ("the", "ofa": too short)
    # corpus words among them: Return, value, strings, Value (RETURN: case; xvalue, valu, strin: not whole words)
    assert pydocs.word_share(samples, corpus) == (4, 8)
    assert pydocs.word_share(["abc de fgh"], corpus) == (0, 0)  # no word of 4+ letters
    assert pydocs.word_share(["Returning"], {"Return"}) == (0, 1)  # a word, not a prefix of one


def test_samples_are_cut_out_of_sample_py_output_by_length():
    rule = "-" * 60
    texts = ["\nab\n" + rule + "\ncd", "\n" + "x" * 66]  # 67 characters each; the first holds a line of dashes
    stdout = f"ckpt.pt (iter 8): tssa ...\n{rule}\n{texts[0]}\n{rule}\n{texts[1]}\n{rule}\n16 tokens in 0.1s\n"
    assert pydocs.parse_samples(stdout, 2, len(texts[0])) == texts
    with pytest.raises(RuntimeError, match="not 2 samples of 8 characters"):
        pydocs.parse_samples(stdout, 2, 8)


def test_counting_loss_equals_a_direct_count():
    rng = np.random.default_rng(0)
    V = 5
    train, val = rng.integers(0, V, 3000), rng.integers(0, V, 400)
    for order in (1, 2, 3):
        pairs = Counter(tuple(train[i - order + 1:i + 1]) for i in range(order - 1, len(train)))
        contexts = Counter(tuple(train[i - order + 1:i]) for i in range(order - 1, len(train)))
        direct = -np.mean([math.log((pairs[tuple(val[i - order + 1:i + 1])] + 0.1) /
                                    (contexts[tuple(val[i - order + 1:i])] + 0.1 * V))
                           for i in range(order - 1, len(val))])
        # float64 sums of a few hundred logs: agreement to 1e-12 relative
        assert pydocs.counting_loss(train, val, order, V, alpha=0.1) == pytest.approx(direct, rel=1e-12)


def test_equal_time_gives_each_model_the_budget_over_its_seconds_per_iteration():
    C = cli.configure(pydocs.SETTINGS, ["--iters=800"])[0]
    names = ["tost", "softmax", "linear"]
    cal = {"models": {m: dict(s_per_iter=s, recipe_id=pydocs.recipe_id(m, C))
                      for m, s in zip(names, (0.1, 0.08, 0.125))}}
    budget, counts = pydocs.equal_time_iters(cal, names, C)
    assert budget == pytest.approx(80.0)  # 800 iterations of tost at 0.1 s (float products: approx)
    assert counts == {"tost": 800, "softmax": 1000, "linear": 640}
    cal["models"]["softmax"]["recipe_id"] = "another"  # measured for other settings: refused
    with pytest.raises(cli.UserError, match="no calibration of softmax with these settings"):
        pydocs.equal_time_iters(cal, names, C)


# -----------------------------------------------------------------------------
# the command


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small character-level dataset of repeated docstring-like sentences."""
    root = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(0)
    words = "Return the value of the string object in this file and raise an error when it fails".split()
    text = "\n".join(" ".join(rng.choice(words, 9)) + "." for _ in range(600))
    (root / "corpus.txt").write_text(text)
    prepare_char.main([f"--input={root / 'corpus.txt'}", f"--data_dir={root / 'data'}", "--name=t_char"])
    return root


def script(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "results", "compare", "pydocs.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.mark.parametrize("bad, message", [
    (["--models=tost,gpt"], "models: unknown 'gpt'; choose from tost, tost_conv, softmax, linear, hybrid_conv"),
    (["--models=tost,tost"], "models names tost more than once: name each once"),
    (["--seeds=1,x"], "seeds must be whole numbers separated by commas: 'x' is not one, got '1,x'"),
    (["--seeds=1,1"], "seeds names 1 more than once: name each once, got '1,1'"),
    (["--conditions=speed"], "conditions: unknown 'speed'; choose from iters, time"),
    (["--calib_skip=60"], "calib_skip (60) must be below calib_iters (60): some steps must be timed"),
    (["--out=table.md"], "out must be a .json file (the figure goes beside it), got 'table.md'"),
    (["--time_ref=gpt"], "unknown model 'gpt': choose from"),
])
def test_bad_settings_are_refused_before_any_run(bad, message):
    with pytest.raises(cli.UserError) as e:
        pydocs.main(bad)
    assert str(e.value).startswith(message)


def test_a_refusal_is_one_line(corpus, capsys):
    p = script("--models=tost,gpt")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == ("results/compare/pydocs.py: models: unknown 'gpt'; choose from tost, tost_conv, softmax, linear, "
                        "hybrid_conv\n")
    data = [f"--data_dir={corpus / 'data'}", "--dataset=t_char"]
    with pytest.raises(cli.UserError, match="no calibration at .*none.json: measure one first with python "
                                            "results/compare/pydocs.py --calibrate"):
        pydocs.main([*data, "--conditions=time", f"--calibration={corpus / 'none.json'}"])
    with pytest.raises(cli.UserError, match="dataset 'missing' is not prepared"):
        pydocs.main([f"--data_dir={corpus / 'data'}", "--dataset=missing"])


def test_quick_runs_end_to_end_and_continues_from_its_results(corpus, capsys):
    out_root, out = corpus / "out", corpus / "q.json"
    args = ["--quick", f"--data_dir={corpus / 'data'}", "--dataset=t_char", f"--out_root={out_root}", f"--out={out}"]
    data = pydocs.main(args)  # (in this process: train.py, evaluate.py and sample.py run as their own)
    printed = capsys.readouterr().out
    assert data == json.loads(out.read_text())
    cal = json.loads((out_root / "calibration.json").read_text())  # --quick's own, never the committed one
    assert set(cal["models"]) == {"tost"} and cal["models"]["tost"]["s_per_iter"] > 0
    assert data["conditions"]["iters"]["iters"] == data["conditions"]["time"]["iters"] == {"tost": 8}
    [row] = data["rows"]  # the reference model's equal-time run is its equal-iteration run
    assert (row["model"], row["seed"], row["iters"]) == ("tost", 1337, 8)
    assert math.isfinite(row["val_loss"]) and row["val_tokens"] == 2000  # --quick scores 2000 tokens
    assert len(row["samples"]) == 3 and all(len(s) == 61 and s[0] == "\n" for s in row["samples"])
    text = (corpus / "corpus.txt").read_text()
    train_text = text[:len(text) - round(len(text) * 0.1)]  # prepare_char.py: the last tenth of a file is val
    assert (row["corpus_words"], row["words"]) == pydocs.word_share(row["samples"], pydocs.corpus_words(train_text))
    assert 0 < data["counting"]["val_loss"]["3"] < data["counting"]["val_loss"]["2"]  # more context, lower loss
    table = pydocs_tables.compare_table(data)
    assert table in printed and "| ToST, the paper's layer |" in table and "[1/1] tost" in printed
    assert (corpus / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pydocs.main(args) == data  # the same command: the run is found in results.json, nothing runs again
    printed = capsys.readouterr().out
    assert "calibrating" not in printed and "[1/1]" not in printed and table in printed


def test_readme_table_is_the_committed_json_rendered():
    path, fn = pydocs_tables.TABLES["pydocs_compare"]
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        data = json.load(f)
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    block = re.search(r"<!-- table: pydocs_compare -->\n(.*?)<!-- /table -->", readme, re.S)
    assert block is not None, "README.md has no pydocs_compare table block"
    assert block.group(1) == fn(data).rstrip() + "\n"
