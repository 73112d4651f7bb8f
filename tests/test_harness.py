"""
Tests of lm_eval_adapter.py, the lm-evaluation-harness adapter, evaluate.py --harness and
lm_harness.py (lm-eval's command line with the adapter registered). CPU only,
offline, tiny random models over a character vocabulary prepared by prepare_char.py.

    python -m pytest -q tests/test_harness.py

Every test but the missing-package ones needs lm-eval (requirements-dev.txt installs it) and
is skipped, saying so, without it. Each path of the adapter is checked against an independent
one: loglikelihood_rolling against evaluate.py's summed loss over the same tokens,
loglikelihood against a plain forward pass, generate_until against GPT.generate and against
re-running the full forward pass for every token; and a whole simple_evaluate run over local
task files against the adapter's own answers. The file takes about 15 s on 2 idle cores.
"""

import json
import os
import re
import runpy
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers_advice import assert_advice_exists  # noqa: E402
from test_train import REPO, TIKTOKEN_CACHE, call_main, greedy_by_full_forward, needs_bpe  # noqa: E402

import evaluate  # noqa: E402
import prepare_char  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
import nanotost  # noqa: E402
from nanotost import checkpoints, cli
from nanotost import textdata as td  # noqa: E402

T = 32  # block_size of the tiny models


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one CPU thread is faster than contending ones (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def harness():
    """lm_eval_adapter, imported (lm-eval is an optional extra)."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval==0.4.13)")
    from nanotost import lm_eval_adapter

    return lm_eval_adapter


def save_random_model(out_dir, tokenizer, attn, vocab_size, seed=0):
    """A tiny untrained GPT saved as train.py would: a random but fixed model is enough to
    compare two ways of computing the same numbers. The token embeddings are scaled up so that
    the logits spread out (init std 0.02 leaves near-ties that float rounding could flip)."""
    args = dict(n_layer=2, n_head=2, n_embd=32, block_size=T, vocab_size=vocab_size, attn=attn,
                layer_scale_init=1e-5 if attn == "tssa" else None)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():
        model.wte.weight.mul_(50)
        for name, p in model.named_parameters():  # layer scale 1e-5 would leave the blocks almost silent
            if name.endswith("_scale.weight"):
                p.fill_(1.0)
    os.makedirs(out_dir, exist_ok=True)
    checkpoints.save_checkpoint(dict(kind="language", model=model.state_dict(), model_args=args, iter_num=7, config={},
                            tokenizer=tokenizer),
                       os.path.join(out_dir, "ckpt.pt"))
    model.eval()
    return model


@pytest.fixture(scope="module")
def char(tmp_path_factory):
    """A character vocabulary (prepare_char.py over 40K characters of the embedded corpus) and
    a random ToST and softmax model over it."""
    root = tmp_path_factory.mktemp("harness")
    src = root / "docs.txt"
    src.write_text("\n\n".join(prepare_char.pydocs_docs(max_chars=40_000)), encoding="utf-8")
    prepare_char.main([f"--input={src}", f"--data_dir={root / 'data'}"])
    with open(root / "data" / "docs_char" / "meta.json") as f:
        meta = json.load(f)
    tokenizer = {k: meta[k] for k in ("dataset", "tokenizer", "vocab_size", "chars")}
    models = {attn: save_random_model(str(root / attn), tokenizer, attn, meta["vocab_size"])
              for attn in ("tssa", "softmax")}
    val = np.fromfile(root / "data" / "docs_char" / "val.bin", dtype=np.uint16)
    encode, decode = td.load_tokenizer(meta)
    return dict(root=root, meta=meta, models=models, text=decode(val[:400].tolist()), encode=encode, decode=decode)


def requests(kind, *args):
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a if isinstance(a, tuple) else (a,), i) for i, a in enumerate(args)]


# -----------------------------------------------------------------------------
# loglikelihood_rolling == evaluate.py


@pytest.mark.parametrize("attn,stride", [("tssa", 0), ("tssa", 8), ("softmax", 0)])
def test_rolling_equals_evaluate_py_over_the_same_tokens(harness, char, attn, stride, capsys):
    """The adapter's log-probability of a text is minus evaluate.py's summed loss over a split
    holding the same stream: the prefix token ("\\n" at character level), then the text."""
    out_dir = str(char["root"] / attn)
    lm = harness.NanoToSTLM(out_dir=out_dir, device="cpu", batch_size=3, stride=stride)
    text = char["text"][:150]  # 150 predictions: 5 windows of 32 (or 18 overlapping ones of stride 8)
    stream = [char["meta"]["chars"].index("\n")] + char["encode"](text)
    folder = char["root"] / "data" / f"roll_{attn}_{stride}"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps(dict(char["meta"], splits={"val": len(stream)})))
    np.array(stream, dtype=np.uint16).tofile(folder / "val.bin")
    code, out, err = call_main(evaluate, f"--out_dir={out_dir}", f"--data_dir={folder.parent}",
                               f"--dataset={folder.name}", f"--stride={stride}", "--batch_size=4", "--device=cpu",
                               capsys=capsys)
    assert code == 0, err
    with open(os.path.join(out_dir, "eval.jsonl")) as f:
        record = [json.loads(line) for line in f][-1]
    assert record["tokens"] == len(text) == 150
    [logprob] = lm.loglikelihood_rolling(requests("loglikelihood_rolling", text))
    # the same float32 forward passes, summed in another order and batched differently: 1e-5 relative
    assert logprob == pytest.approx(-record["loss"] * record["tokens"], rel=1e-5)


def test_score_rows_score_every_target_token_once(harness):
    for n, n_score, stride in ((5, 5, 4), (33, 33, 32), (100, 100, 32), (100, 100, 7), (64, 64, 1), (100, 50, 32),
                               (100, 50, 5), (100, 10, 32)):
        stream = list(range(n + 1))  # distinct tokens; token i + 1 is predicted from tokens <= i
        rows = harness.score_rows(stream, n_score, T, stride)
        predicted = [tok for row, skip in rows for tok in row[skip + 1:]]
        assert sorted(predicted) == stream[-n_score:] and all(len(row) <= T + 1 for row, _ in rows)
    [(row, skip)] = harness.score_rows(list(range(101)), 10, T, 32)  # a short target: all the context that fits
    assert row == list(range(68, 101)) and skip == 22


# -----------------------------------------------------------------------------
# loglikelihood == a plain forward pass


def direct_loglikelihood(model, ids, n_cont, n_vocab):
    """log P of the last n_cont ids given the ones before (the last T + 1 ids), and whether each
    is the argmax over the real vocabulary: one forward pass, float32."""
    ids = ids[-(T + 1):]
    logits, _ = model(torch.tensor([ids[:-1]]))
    logp = logits[0].log_softmax(-1)[-n_cont:]  # (n_cont, V)
    target = torch.tensor(ids[-n_cont:])
    return logp.gather(1, target[:, None]).sum().item(), bool((logp[:, :n_vocab].argmax(-1) == target).all())


@pytest.mark.parametrize("attn", ["tssa", "softmax"])
def test_loglikelihood_agrees_with_a_direct_forward(harness, char, attn):
    model, encode, decode = char["models"][attn], char["encode"], char["decode"]
    n_vocab = char["meta"]["vocab_size"]
    ctx = char["text"][:20]
    with torch.no_grad():
        greedy = decode(greedy_by_full_forward(model, encode(ctx), 5)[20:])  # what greedy decoding writes
    wrong = greedy[:-1] + next(c for c in "xyz" if c != greedy[-1])
    pairs = [(ctx, greedy), (ctx, wrong), ("", char["text"][:9]), (char["text"][:100], char["text"][100:110]),
             (char["text"][:3] + " ", char["text"][3:12])]
    results = {}
    for batch_size in (1, 4):
        lm = harness.NanoToSTLM(out_dir=str(char["root"] / attn), device="cpu", batch_size=batch_size)
        results[batch_size] = lm.loglikelihood(requests("loglikelihood", *pairs))
    newline = char["meta"]["chars"].index("\n")
    with torch.no_grad():
        expected = [direct_loglikelihood(model, (encode(c) or [newline]) + encode(x), len(x), n_vocab)
                    for c, x in pairs]
    for got in results.values():
        # float32, the same maths in batches of other shapes: 1e-5 relative, and 1e-4 absolute for
        # log-probabilities near 0 (a log-sum-exp of logits of size ~30 rounds at ~1e-5)
        assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in expected], rel=1e-5, abs=1e-4)
        assert [g for _, g in got] == [g for _, g in expected]
    assert results[1][0][1] and not results[1][1][1]  # the greedy continuation is greedy, the altered one is not


@needs_bpe
def test_gpt2_tokenizer_conditions_on_endoftext_and_moves_the_space(harness, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", os.path.abspath(TIKTOKEN_CACHE))
    info = dict(dataset="owt", tokenizer="gpt2", vocab_size=50257)
    model = save_random_model(str(tmp_path), info, "tssa", 50304)  # vocab padded to a multiple of 64, as train.py
    lm = harness.NanoToSTLM(out_dir=str(tmp_path), device="cpu")
    encode, _ = td.load_tokenizer(info)
    [a, b] = lm.loglikelihood(requests("loglikelihood", ("The cat sat on the", " mat"), ("The cat sat on the ", "mat")))
    assert a == b  # the trailing space of a context goes with the continuation: " mat" is one token
    [rolling] = lm.loglikelihood_rolling(requests("loglikelihood_rolling", "Hello world"))
    with torch.no_grad():
        expected, _ = direct_loglikelihood(model, [50256] + encode("Hello world"), 2, 50257)
    assert rolling == pytest.approx(expected, rel=1e-5)  # the first token conditioned on <|endoftext|>


# -----------------------------------------------------------------------------
# generate_until == GPT.generate, cut at the stop string


@pytest.mark.parametrize("attn", ["tssa", "softmax"])
def test_generate_until_is_greedy_generate_cut_at_the_stop_string(harness, char, attn):
    model, encode, decode = char["models"][attn], char["encode"], char["decode"]
    text = char["text"]
    prompts = [text[:12], text[20:32], text[50:57], text[:40]]  # two of one length: decoded together
    max_gen = 16  # the 40-character prompt keeps its last T - 16 = 16
    with torch.no_grad():
        full = []
        for p in prompts:
            ids = encode(p)[-(T - max_gen):]
            out = model.generate(torch.tensor([ids]), max_gen, temperature=0)[0].tolist()
            assert out == greedy_by_full_forward(model, ids, max_gen)  # recurrent decoding == the parallel form
            full.append(decode(out[len(ids):]))
    stops = [full[0][6:8], "\u2603", full[2][3], full[3][10:12]]  # a snowman never comes: all max_gen tokens
    kwargs = [dict(until=[s, "\u2604"], max_gen_toks=max_gen, do_sample=False) for s in stops]
    kwargs[1]["until"] = "\u2603"  # a single string, as some tasks give it
    lm = harness.NanoToSTLM(out_dir=str(char["root"] / attn), device="cpu", batch_size=2)
    got = lm.generate_until(requests("generate_until", *zip(prompts, kwargs)))
    expected = [f[:f.index(s)] if s in f else f for f, s in zip(full, stops)]
    assert got == expected
    assert got[1] == full[1] and len(encode(got[1])) == max_gen  # no stop string: max_gen_toks tokens
    assert len(got[0]) <= 6 and len(got[2]) <= 3  # cut at the first occurrence


# -----------------------------------------------------------------------------
# issue 26, class 2: the adapter inside the error mechanism (sample.py's rules, one line each)


def task_requests(task, *args):
    from lm_eval.api.instance import Instance

    return [Instance("generate_until", {}, a, i, metadata=(task, i, 1)) for i, a in enumerate(args)]


@pytest.mark.parametrize("kwargs,words", [
    (dict(until=[5]), "until must be a string or a list of strings, got [5]"),
    (dict(until="."), None), (dict(until=["."], top_k=0, do_sample=True), None),  # 0: no limit, as sample.py
    (dict(until=["."], do_sample=True, temperature=-1.0), "temperature must not be negative, got -1.0"),
    (dict(until=["."], do_sample=True, top_k=-3), "top_k must not be negative, got -3"),
    (dict(until=["."], max_gen_toks=-1), "max_gen_toks must not be negative, got -1"),
    (dict(until=["."], top_k="many"), "top_k expects int"),
    (dict(until=["."], max_gen_toks=2**64), "max_gen_toks must be within int64"),
])
def test_generation_settings_follow_sample_py_and_are_one_line_naming_the_task(harness, char, kwargs, words):
    lm = harness.NanoToSTLM(out_dir=str(char["root"] / "tssa"), device="cpu")
    if words is None:  # accepted: top_k 0 samples from every token, as no top_k does
        torch.manual_seed(0)
        got = lm.generate_until(task_requests("my_task", ("Th", dict(kwargs, max_gen_toks=6))))
        torch.manual_seed(0)
        free = {k: v for k, v in kwargs.items() if k != "top_k"}
        assert got == lm.generate_until(task_requests("my_task", ("Th", dict(free, max_gen_toks=6))))
        return
    with pytest.raises(cli.UserError) as refusal:
        lm.generate_until(task_requests("my_task", ("Th", kwargs)))
    message = str(refusal.value)
    assert message.startswith("lm-eval task 'my_task': generation_kwargs: ") and words in message, message
    assert "\n" not in message and "nanotost follows sample.py" in message


@pytest.mark.parametrize("args,own,clash", [
    ("batch_size=4", {"batch_size": 1, "max_batch_size": None, "device": None}, "batch_size"),  # lm-eval's default 1
    ("device=cpu,batch_size=4", {"batch_size": 1, "device": "cuda:0"}, "batch_size, device"),
    ("stride=8", {"batch_size": 4, "max_batch_size": None, "device": "cpu"}, None),
])
def test_model_args_that_lm_eval_hands_the_model_itself_are_named(harness, char, args, own, clash):
    """lm_harness.py --model_args out_dir=...,batch_size=4 (what the adapter once offered): lm-eval
    passes its own --batch_size too, a TypeError inside lm-eval before; now one line naming both."""
    arg_string = f"out_dir={char['root'] / 'tssa'},{args}"
    if clash is None:
        lm = harness.NanoToSTLM.create_from_arg_string(arg_string, own)
        assert (lm.batch_size, lm._device, lm.stride) == (4, "cpu", 8)
        return
    with pytest.raises(cli.UserError) as refusal:
        harness.NanoToSTLM.create_from_arg_string(arg_string, own)
    message = f"lm_harness.py: {refusal.value}"
    assert f"--model_args {clash}: lm-eval hands the model its own" in message and "\n" not in message
    assert_advice_exists(message)
    doc = harness.NanoToSTLM.__doc__
    offered = doc[doc.index("model_args"):doc.index("tssa_impl")]  # the model_args the docstring lists
    assert "batch_size" not in offered and "device" not in offered


# -----------------------------------------------------------------------------
# evaluate.py --harness: simple_evaluate end to end, offline, over local task files

TASKS = {
    "next_chars": """task: next_chars
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: perplexity, aggregation: perplexity, higher_is_better: false}}
""",
    "whole_text": """task: whole_text
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{page}}}}"
metric_list:
  - {{metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}}
  - {{metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}}
""",
    "continue": """task: continue
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}, cache_dir: {cache}}}
output_type: generate_until
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs: {{until: ["."], max_gen_toks: 8, do_sample: false}}
metric_list:
  - {{metric: exact_match, aggregation: mean, higher_is_better: true}}
""",
}


def test_evaluate_harness_runs_local_tasks_end_to_end(harness, char, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # time only: lm-eval's report of the environment (pip list, nvidia-smi, ... ~6 s of subprocesses)
    # is not under test, and its bootstrap runs in this process instead of a pool of workers
    import lm_eval.evaluator

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    text, out_dir = char["text"], str(char["root"] / "tssa")
    docs = [dict(context=text[i:i + 15], target=text[i + 15:i + 18], page=text[i:i + 60]) for i in range(0, 240, 40)]
    lm = harness.NanoToSTLM(out_dir=out_dir, device="cpu")
    greedy = lm.generate_until(requests("generate_until",
                                        *[(d["context"], dict(until=["."], max_gen_toks=8)) for d in docs]))
    docs[0]["target"] = greedy[0]  # one exact match for certain
    specs = []
    for name, template in TASKS.items():
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        task = template.format(data=json.dumps(str(data)), cache=json.dumps(str(tmp_path / "hf")))
        (tmp_path / f"{name}.yaml").write_text(task)
        specs.append(str(tmp_path / f"{name}.yaml"))
    code, out, err = call_main(evaluate, f"--out_dir={out_dir}", f"--harness={','.join(specs)}", "--device=cpu",
                               "--batch_size=4", capsys=capsys)
    assert code == 0, err
    assert "next_chars" in out and "word_perplexity" in out  # lm-eval's table
    with open(os.path.join(out_dir, "eval.jsonl")) as f:
        record = [json.loads(line) for line in f][-1]
    results = record["results"]
    assert record["iter"] == 7 and record["harness"] == specs
    # the harness's aggregates of the adapter's own answers, recomputed here (float32 sums: 1e-5 relative)
    ll = lm.loglikelihood(requests("loglikelihood", *[(d["context"], d["target"]) for d in docs]))
    assert results["next_chars"]["acc,none"] == pytest.approx(np.mean([g for _, g in ll]), abs=1e-12)
    assert results["next_chars"]["perplexity,none"] == pytest.approx(np.exp(-np.mean([lp for lp, _ in ll])), rel=1e-5)
    rolling = lm.loglikelihood_rolling(requests("loglikelihood_rolling", *[d["page"] for d in docs]))
    words = sum(len(re.split(r"\s+", d["page"])) for d in docs)  # lm-eval's count of words
    assert results["whole_text"]["word_perplexity,none"] == pytest.approx(np.exp(-sum(rolling) / words), rel=1e-5)
    n_bytes = sum(len(d["page"].encode()) for d in docs)
    assert results["whole_text"]["bits_per_byte,none"] == pytest.approx(-sum(rolling) / n_bytes / np.log(2), rel=1e-5)
    expected_match = np.mean([g == d["target"] for g, d in zip(greedy, docs)])
    assert results["continue"]["exact_match,none"] == pytest.approx(expected_match, abs=1e-12) and expected_match > 0


def test_a_task_that_is_not_there_is_one_line(harness, char, tmp_path, capsys):
    not_a_task = tmp_path / "notes.yaml"
    not_a_task.write_text("title: not a task\n")
    for spec, words in ((tmp_path / "missing.yaml", "not found"), (not_a_task, "not a task lm-eval can load")):
        code, _, err = call_main(evaluate, f"--out_dir={char['root'] / 'tssa'}", f"--harness={spec}", capsys=capsys)
        assert code == 1 and str(spec) in err and words in err and len(err.strip().splitlines()) == 1, err


# -----------------------------------------------------------------------------
# without lm-eval (these run whether or not it is installed)


def test_without_lm_eval_evaluate_harness_says_how_to_install(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")] or ["lm_eval"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing lm_eval now fails, as when it is not installed
    monkeypatch.delitem(sys.modules, "nanotost.lm_eval_adapter", raising=False)
    monkeypatch.delattr(nanotost, "lm_eval_adapter", raising=False)  # (the package's attribute: imported anew)
    save_random_model(str(tmp_path), dict(dataset="x", tokenizer="char", vocab_size=3, chars="abc"), "tssa", 3)
    code, out, err = call_main(evaluate, f"--out_dir={tmp_path}", "--harness=lambada_openai", capsys=capsys)
    assert code == 1 and "pip install lm-eval==0.4.13" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit, match="pip install lm-eval==0.4.13"):  # python lm_harness.py: the same line
        runpy.run_path(os.path.join(REPO, "lm_harness.py"), run_name="__main__")
