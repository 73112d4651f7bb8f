"""
lm_inspect.py (issue 34): every number of the page recomputed here from the blocks' own records
(Block.forward(..., record=maps)), the page self-contained (nothing it could load from outside),
and the page as a real browser draws it (headless Chromium; skipped, with the reason, where none
is installed): the text and the legend rendered, in a light and a dark theme, the layer switch run.

    python -m pytest -q tests/test_lm_inspect.py

One tiny run of train.py (3 layers, the third softmax: the hybrid with a short convolution,
the most varied case) serves every test; the browser tests start Chromium 3 times (1-3 s each).
"""

import html
import io
import json
import math
import os
import re
import sys
from collections import Counter
from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lm_inspect  # noqa: E402
import train  # noqa: E402
from helpers_advice import assert_advice_exists  # noqa: E402
from model import compression_objective, f_prime, split_heads  # noqa: E402
from nanotost import checkpoints, cli, forks, loading, outputs, plots
from nanotost import textdata as td  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine
CORPUS = "Return the value of x.\nIf 3 items are given, add them: a, b and c!\n\tSee also: 42 (the answer).\n"
CHARS = "".join(sorted(set(CORPUS)))
T = 48  # block_size of the tiny run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(root, the report of an inspection of the val split, the report of one of a given text)."""
    root = tmp_path_factory.mktemp("lm_inspect")
    folder = root / "data" / "text_char"
    folder.mkdir(parents=True)
    ids = np.array([CHARS.index(c) for c in CORPUS * 60], dtype=np.uint16)
    rng = np.random.default_rng(0)
    splits = {"train": ids[:3200], "val": np.concatenate([ids[3200:], rng.permutation(ids[:400])])}  # (val: varied)
    for split, tokens in splits.items():
        tokens.tofile(folder / f"{split}.bin")
    meta = dict(dataset="text_char", tokenizer="char", vocab_size=len(CHARS), chars=CHARS,
                splits={k: len(v) for k, v in splits.items()}, command="python prepare_char.py --input=t.txt")
    (folder / "meta.json").write_text(json.dumps(meta))
    cli.run_cli(train.main, [f"--data_dir={root}/data", "--dataset=text_char", f"--out_dir={root}/out",
                             "--n_layer=3", "--n_head=2", "--n_embd=16", f"--block_size={T}", "--short_conv=2",
                             "--hybrid_every=3", "--layer_scale_init=0.5", "--batch_size=4", "--max_iters=4",
                             "--eval_interval=4", "--eval_iters=1", "--log_interval=100", "--warmup_iters=1",
                             "--gradient_accumulation_steps=1", "--num_threads=1", "--device=cpu",
                             "--dtype=float32", "--learning_rate=1e-2"])
    common = [f"--out_dir={root}/out", "--n_windows=5", "--batch_size=2", "--top_tokens=3", "--num_threads=1"]
    val = lm_inspect.main(common + [f"--page_dir={root}/page", "--val_start=7"])
    given = lm_inspect.main(common + [f"--page_dir={root}/given", "--text=If a, b: see x!\n", "--layers=2"])
    return root, val, given


def model_of(root):
    return loading.load_language_model(os.path.join(root, "out", "ckpt.pt"), "cpu")[0].requires_grad_(False)


@torch.no_grad()
def records(model, idx):
    """Each block's record (z, w, pi, out) written out here (GPT.forward's steps), and the logits."""
    x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
    maps = []
    for block in model.blocks:
        maps.append({})
        x = block(x, record=maps[-1])
    return maps, model.lm_head(model.ln_f(x))


# -----------------------------------------------------------------------------
# the numbers


def test_the_recorded_forward_is_gpt_forward(run):
    root, val, _ = run
    model = model_of(root)
    idx = torch.tensor([val["tokens"]])
    logits, layer_maps = lm_inspect.recorded_forward(model, idx)
    # the same operations in the same order as GPT.forward: equal to the bit
    assert torch.equal(logits, model(idx)[0])
    assert [m is None for m in layer_maps] == [False, False, True]  # the third block is softmax


def test_the_pages_pi_entropy_and_statistic_are_the_blocks_own(run):
    root, val, given = run
    model = model_of(root)
    for report in (val, given):
        maps, _ = records(model, torch.tensor([report["tokens"]]))
        for shown in report["layers"]:
            m, attn = maps[shown["layer"] - 1], model.blocks[shown["layer"] - 1].attn
            pi = m["pi"][0].double()  # (H, T)
            # the page keeps 4 decimals: 5e-5, and fp32 noise far below it
            assert np.allclose(shown["pi"], pi.T.numpy(), rtol=0, atol=5.1e-5)
            sure = (pi.max(0).values - pi.topk(2, 0).values[1]) > 1e-6  # (a tie could go either way)
            assert torch.equal(torch.tensor(shown["dominant"])[sure], pi.argmax(0)[sure])
            mean_entropy = float(-(pi * pi.log()).sum(0).mean())
            assert math.isclose(shown["entropy"], mean_entropy, rel_tol=1e-9)  # (float64 both)
            # the running statistic, one prefix at a time in float64: rtol 1e-4 against fp32 cumsums
            w, pi32 = m["w"][0].double(), m["pi"][0].double()  # (H, T, p), (H, T)
            s = torch.stack([(pi32[:, :j + 1, None] * w[:, :j + 1] ** 2).sum(1) / pi32[:, :j + 1].sum(1)[:, None]
                             for j in range(w.shape[1])], 1)  # (H, T, p)
            assert np.allclose(shown["s_mean"], s.mean(-1).numpy(), rtol=1e-4, atol=0)
            # and it is the statistic the layer used: its step rebuilt from s is the block's own output
            s = forks.running_statistic(m["w"], m["pi"])  # (1, H, T, p)
            step = -m["pi"][..., None] * m["w"] * f_prime(s)  # (1, H, T, p), whatever f is
            rebuilt = attn.c_proj(step.transpose(1, 2).reshape(1, s.shape[2], -1))
            assert torch.allclose(rebuilt, m["out"], rtol=1e-5, atol=1e-6)  # fp32, a few ops apart


def windows_of(root, split, starts):
    data = np.fromfile(root / "data" / "text_char" / f"{split}.bin", dtype=np.uint16).astype(np.int64)
    return torch.tensor(np.stack([data[s:s + T] for s in starts]))  # (n, T)


def test_rvar_before_and_after_each_step_over_the_windows(run):
    root, val, _ = run
    model = model_of(root)
    for split in ("train", "val"):
        rec = val["rvar"][split]
        assert len(rec["starts"]) == 5
        maps, _ = records(model, windows_of(root, split, rec["starts"]))  # all 5 at once (there: 2, 2, 1)
        before, after = [], []
        for block, m in zip(model.blocks[:2], maps[:2]):
            before.append(compression_objective(m["w"], m["pi"]).double())  # (5,)
            w_after = split_heads(block.attn.w_proj(m["z"] + block.attn_scale.weight * m["out"]), 2)
            after.append(compression_objective(w_after, m["pi"]).double())
        before, after = torch.stack(before, 1), torch.stack(after, 1)  # (5, 2)
        # rtol 1e-5: the same fp32 operations in other batches (matmul blocking: ~1e-7, a few ops deep)
        assert np.allclose(rec["before"], before.mean(0).numpy(), rtol=1e-5, atol=0)
        assert np.allclose(rec["after"], after.mean(0).numpy(), rtol=1e-5, atol=0)
        assert rec["lowered"] == (after < before).double().mean(0).tolist()  # (layer scale 0.5: far apart)


def test_what_each_head_takes_is_counted_over_the_val_windows(run):
    root, val, _ = run
    rec = val["rvar"]["val"]
    x = windows_of(root, "val", rec["starts"])
    maps, _ = records(model_of(root), x)
    pieces = [CHARS[i] for i in x.flatten().tolist()]
    kinds = ["spaces" if c.isspace() else "letters" if c.isalpha() else "digits" if c.isdigit() else "punctuation"
             for c in pieces]
    for layer in (0, 1):
        pi = maps[layer]["pi"].permute(0, 2, 1).reshape(-1, 2).double()  # (n * T, H)
        heads = rec["heads"][layer]
        entropy = -(pi * pi.log()).sum(1)  # (n * T,), window by window
        assert math.isclose(rec["entropy"][layer], float(entropy.mean()), rel_tol=1e-9)  # (float64 both)
        assert np.allclose(rec["entropy_by_position"][layer], entropy.view(-1, T).mean(0).numpy(), rtol=1e-9, atol=0)
        for k, row in enumerate(heads):
            mine = [p for p, d in zip(pieces, pi.argmax(1).tolist()) if d == k]
            assert math.isclose(row["share"], len(mine) / len(pieces), rel_tol=1e-12)
            counts = Counter(mine)
            for piece, share, overall in row["top"]:
                assert math.isclose(share, counts[piece] / len(mine), rel_tol=1e-12)
                assert math.isclose(overall, pieces.count(piece) / len(pieces), rel_tol=1e-12)
            assert [n for _, n in counts.most_common(3)] == [round(s * len(mine)) for _, s, _ in row["top"]]
            for kind, value in row["mean_pi"].items():
                chosen = [i for i, c in enumerate(kinds) if c == kind]
                assert math.isclose(value, float(pi[chosen, k].mean()), rel_tol=1e-9), (kind, k)
        assert math.isclose(sum(row["share"] for row in heads), 1.0, rel_tol=1e-12)


def test_the_summary_says_it_per_layer_and_head(run, capsys):
    _, val, _ = run
    lm_inspect.print_summary(val, 2)
    out = capsys.readouterr().out
    by_position = val["rvar"]["val"]["entropy_by_position"][0]
    assert (f"layer 1: entropy of Pi {val['rvar']['val']['entropy'][0]:.3f} (first 8 tokens "
            f"{sum(by_position[:8]) / 8:.3f}, last half {sum(by_position[T // 2:]) / (T // 2):.3f}), R_var "
            f"{val['rvar']['val']['before'][0]:.4g} -> {val['rvar']['val']['after'][0]:.4g}") in out
    assert len(re.findall(r"^  head \d: +\d+% of tokens, most often .*; mean Pi on letters", out, re.M)) == 4
    assert "(log H = 0.693)" in out and out.rstrip().endswith("softmax blocks (no Pi), skipped: 3")


def test_a_text_longer_than_block_size_is_cut_and_a_file_is_read(tmp_path):
    encode, _ = td.load_tokenizer({"tokenizer": "char", "chars": CHARS})
    (tmp_path / "t.txt").write_text("\ufeffIf x", encoding="utf-8")  # (a byte-order mark is no text)
    for text, ids, note in (("a" * (T + 5), [CHARS.index("a")] * T, f"the first {T} tokens of the text given"),
                            (f"FILE:{tmp_path}/t.txt", [CHARS.index(c) for c in "If x"], "the text given")):
        C = SimpleNamespace(text=text, val_start=0)
        assert lm_inspect.shown_tokens(C, encode, T, None, None) == (ids, note)


def test_the_files_and_the_skipped_softmax_block(run):
    root, val, given = run
    assert val["tssa_layers"] == [1, 2] and val["skipped"] == [3] and [L["layer"] for L in val["layers"]] == [1, 2]
    assert [L["layer"] for L in given["layers"]] == [2]
    assert val["tokens"] == windows_of(root, "val", [7])[0].tolist()  # --val_start=7
    assert "".join(given["pieces"]) == "If a, b: see x!\n"
    from PIL import Image

    for folder, report in (("page", val), ("given", given)):
        names = sorted(os.listdir(root / folder))
        assert names == [outputs.MANIFEST, "index.html", "inspect.json", "pi_tokens.png", "rvar.png"]  # (no temp left)
        with open(root / folder / "inspect.json") as f:
            assert json.load(f) == json.loads(json.dumps(report))  # every number drawn, as returned
        for name in ("pi_tokens.png", "rvar.png"):
            with Image.open(root / folder / name) as im:
                assert im.format == "PNG" and im.width >= 700 and im.height >= 250
    assert "Softmax blocks (no Pi), skipped: 3" in (root / "page" / "index.html").read_text()


# -----------------------------------------------------------------------------
# the page: nothing from outside, the text on it


class PageParts(HTMLParser):
    """Every tag with its attributes, the text of style and script elements, the token spans' text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.styles, self.scripts, self.tokens, self._in = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in.append((tag, dict(attrs)))
        if tag == "span" and "tok" in dict(attrs).get("class", "").split():
            self.tokens.append("")

    def handle_endtag(self, tag):
        while self._in and self._in.pop()[0] != tag:
            pass

    def handle_data(self, data):
        tag, attrs = self._in[-1] if self._in else ("", {})
        if tag == "style":
            self.styles.append(data)
        elif tag == "script":
            self.scripts.append(data)
        elif tag == "span" and "tok" in attrs.get("class", "").split():
            self.tokens[-1] += data


FETCHING_TAGS = {"link", "img", "iframe", "frame", "object", "embed", "audio", "video", "source", "track", "base",
                 "image", "use"}
FETCHING_ATTRS = {"src", "href", "xlink:href", "srcset", "action", "formaction", "poster", "data", "background",
                  "manifest", "ping", "codebase", "archive", "longdesc", "cite"}
FETCHING_CALLS = ("fetch(", "XMLHttpRequest", "import(", "importScripts", "WebSocket", "EventSource", "new Image",
                  "sendBeacon", ".src", "location.href =", "window.open", "@import", "url(")


def outside_references(page):
    """What in an HTML page could load something: tags that fetch, attributes that point somewhere,
    url() and @import in style, network calls in script, any URL scheme at all."""
    parts = PageParts()
    parts.feed(page)
    found = [f"<{tag}>" for tag, _ in parts.tags if tag in FETCHING_TAGS]
    found += [f"{tag} {name}={value!r}" for tag, attrs in parts.tags for name, value in attrs.items()
              if name in FETCHING_ATTRS]
    found += [f"style: {m}" for text in parts.styles + [a.get("style") or "" for _, a in parts.tags]
              for m in re.findall(r"url\s*\(|@import", text, re.I)]
    found += [f"script: {call}" for text in parts.scripts for call in FETCHING_CALLS if call in text]
    found += [f"a URL: {m}" for m in re.findall(r"\b(?:https?|file|ftp|wss?|data):[^\s\"'<>]{0,40}", page, re.I)]
    return found


def test_the_page_loads_nothing_from_outside(run):
    root, _, _ = run
    for folder in ("page", "given"):
        page = (root / folder / "index.html").read_text()
        assert outside_references(page) == []
        parts = PageParts()
        parts.feed(page)
        assert [t for t, a in parts.tags if t == "script" and a.get("type") != "application/json"] == ["script"]
        assert len(parts.styles) == 1 and parts.scripts  # its own style and script, inline
    # the check can fail: each way of loading something, put into the page, is found
    page = (root / "page" / "index.html").read_text()
    for intruder in ('<img alt="" src="https://example.org/a.png">', '<link rel="stylesheet" href="s.css">',
                     '<span style="background: url(x.png)"></span>', "<style>@import 'f.css';</style>",
                     "<script>fetch('/x')</script>", '<script src="a.js"></script>'):
        assert outside_references(page.replace("<body", intruder + "<body", 1)), intruder


def test_the_text_on_the_page_is_the_text(run):
    root, val, given = run
    for folder, report in (("page", val), ("given", given)):
        parts = PageParts()
        parts.feed((root / folder / "index.html").read_text())
        shown = [t.replace("\u21b5\n", "\n").replace("\u21e5\t", "\t") for t in parts.tokens]  # (the drawn marks)
        assert shown == report["pieces"] and len(shown) == len(report["tokens"])


# -----------------------------------------------------------------------------
# the page in a browser

needs_browser = pytest.mark.skipif(lm_inspect.browser() is None,
                                   reason="no Chromium on PATH (Debian: apt-get install chromium)")


def pixels(png):
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB")).astype(np.int64)  # (height, width, 3)


def luminance(image):
    return image @ np.array([0.299, 0.587, 0.114])


def hidden(page_path, selector, tmp_path):
    """A copy of the page with `selector` hidden (visibility: the layout stays as it was)."""
    variant = tmp_path / "hidden.html"
    variant.write_text(page_path.read_text().replace("</head>", f"<style>{selector} {{ visibility: hidden; }}</style>"
                                                               "</head>", 1))
    return variant


@pytest.fixture(scope="module")
def drawn(run, tmp_path_factory):
    """Chromium's pictures of the val page (3 runs): as it opens; with the text and legend
    hidden; at #layer=2 in a dark theme, with the HTML its script left."""
    root, val, _ = run
    page = root / "page" / "index.html"
    light = pixels(lm_inspect.screenshot_png(page))
    blank = pixels(lm_inspect.screenshot_png(hidden(page, "#legend, #text", tmp_path_factory.mktemp("hidden"))))
    png, dom = lm_inspect.screenshot_png(page, layer=2, dark=True, dom=True)
    return light, blank, pixels(png), dom


@needs_browser
def test_a_browser_draws_the_text_and_the_legend(run, drawn):
    _, val, _ = run
    light, blank, _, _ = drawn
    changed = (light != blank).any(-1)  # (height, width): what the legend and the text drew
    legend_rows = np.zeros(len(light), bool)
    for colour in val["colours"]:  # each swatch: 30 x 18 px of its head's colour, exactly (sRGB forced)
        swatch = changed & (light == colour).all(-1)
        assert swatch.sum() >= 400, colour
        legend_rows |= swatch.any(1)
    top, bottom = np.flatnonzero(legend_rows)[[0, -1]]
    glyphs = changed & (luminance(light) < 110)
    assert glyphs[top:bottom + 1].sum() >= 100  # the legend's labels ("head 1", ...), beside the swatches
    text = glyphs[bottom + 8:]  # below the legend: the text (the rest of the page is the same in both)
    assert text.sum() >= 10 * T  # dark glyphs: about 20-40 pixels a character at 17 px (a blank text: 0)
    tinted = changed[bottom + 8:] & (np.ptp(light[bottom + 8:], -1) > 12)  # token backgrounds: neither white nor grey
    assert tinted.sum() >= 60 * T
    assert luminance(light[:5, :5]).mean() > 200  # the light theme's background


@needs_browser
def test_the_page_reads_in_a_dark_theme(drawn):
    light, blank, dark, _ = drawn
    assert luminance(dark[:5, :5]).mean() < 60  # the page follows the browser's dark theme
    rows, cols = np.nonzero((light != blank).any(-1))  # where the legend and the text are (the same layout)
    area = (slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1))
    assert (luminance(dark[area]) > 150).sum() >= 15 * T  # light glyphs on the dark page
    assert (luminance(light[area]) > 150).sum() > (luminance(dark[area]) > 150).sum()  # (and not a light page)


def numbers(css):
    return [float(v) for v in re.findall(r"[\d.]+", css)]


@needs_browser
def test_the_layer_switch_recolours_the_text(run, drawn):
    """#layer=2 opens the page at layer 2: the script ran and coloured each token by layer 2's
    dominant head (the DOM after the script, as Chromium dumps it)."""
    _, val, _ = run
    dom = drawn[3]
    body = re.search(r"<body([^>]*)>", dom).group(1)
    assert 'data-ready="yes"' in body and 'data-layer="2"' in body
    info = re.search(r'<div id="info"[^>]*>(.*?)</div>', dom, re.S).group(1)  # the first token's Pi, layer 2
    assert "(token 1) in layer 2: Pi = head 1" in info and info.count('class="bar"') == 2  # (H = 2 bars)
    spans = re.findall(r'<span class="tok"[^>]*>', dom)
    heads = [int(re.search(r'data-head="(\d+)"', s).group(1)) for s in spans]
    colours = [numbers(re.search(r"background-color:\s*([^;\"]+)", s).group(1)) for s in spans]
    layer1, layer2 = val["layers"]
    assert heads == [d + 1 for d in layer2["dominant"]]
    assert colours == [numbers(c) for c in layer2["background"]]
    assert layer2["background"] != layer1["background"]  # (the page opened at layer 1 drew those)


# -----------------------------------------------------------------------------
# refusals: one line, nothing written


def refused(argv, root, words):
    before = sorted(str(p) for p in root.rglob("*"))
    saved = sys.argv[0]
    sys.argv[0] = "lm_inspect.py"
    try:
        with pytest.raises(SystemExit) as e:
            cli.run_cli(lm_inspect.main, argv)
    finally:
        sys.argv[0] = saved
    message = e.value.code
    assert isinstance(message, str) and message.startswith("lm_inspect.py: ") and "\n" not in message, message
    assert words in message, message
    assert_advice_exists(message, "lm_inspect.py")
    assert sorted(str(p) for p in root.rglob("*")) == before, "a refusal wrote something"


def test_what_cannot_be_inspected_is_one_line(run, tmp_path):
    root, _, _ = run
    out = [f"--out_dir={root}/out", f"--page_dir={root}/p"]
    refused(out + ["--layers=3"], root, "this model's TSSA layers are 1,2")  # the softmax block
    refused(out + ["--layers=1,x"], root, "layers must be layer numbers")
    refused(out + ["--text=Z"], root, "not in this model's vocabulary")
    refused(out + [f"--val_start={10 ** 6}"], root, "give --val_start below")
    refused(out + ["--screenshot=page.jpg"], root, "give a .png path")
    refused([f"--out_dir={tmp_path}/none"], root, "no checkpoint at")
    ckpt = checkpoints.load_checkpoint(str(root / "out" / "ckpt.pt"), "language")  # the same run, said to be softmax
    args = dict(ckpt["model_args"], attn="softmax", short_conv=0, hybrid_every=0)
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(**args))
    (tmp_path / "soft").mkdir()
    torch.save(dict(ckpt, model_args=args, model=model.state_dict()), tmp_path / "soft" / "ckpt.pt")
    refused([f"--out_dir={tmp_path}/soft"], tmp_path, "is a softmax model: lm_inspect.py draws TSSA's Pi")


@pytest.mark.parametrize("name", ["cost $5", "a$b$c", "$x^$", "back\\slash $_{}", "<b>$&amp;"])
def test_a_path_from_the_user_is_text_in_the_figures_and_the_page(run, tmp_path, name):
    """A `$` or markup in the checkpoint's path (the figures' titles, the page's title and
    description) and in the page folder: drawn as given (plots.pyplot: no mathtext), escaped in
    the page. (A `$` among the tokens themselves: tests/test_outputs.py, this model has none.)"""
    import shutil

    root = run[0]
    (tmp_path / name).mkdir()
    shutil.copy(root / "out" / "ckpt.pt", tmp_path / name / "ckpt.pt")
    page = tmp_path / f"page {name}"
    report = lm_inspect.main([f"--out_dir={tmp_path / name}", f"--data_dir={root}/data", f"--page_dir={page}",
                              "--text=If a, b: see x!", "--n_windows=2", "--batch_size=2", "--num_threads=1"])
    assert name in report["description"]
    assert sorted(os.listdir(page)) == [outputs.MANIFEST, "index.html", "inspect.json", "pi_tokens.png", "rvar.png"]
    html_text = (page / "index.html").read_text()
    assert html.escape(name) in html_text and (name == html.escape(name) or name not in html_text)
