"""
Tests of the language-modelling pipeline: prepare_openwebtext.py, train.py, sample.py.
CPU only, offline, tiny models (2 layers, width 32, context 32).

    python -m pytest -q tests/test_train.py

The scripts run as subprocesses, as a user runs them (resume across processes, torchrun).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import prepare_openwebtext as prep  # noqa: E402
import train  # noqa: E402
import trainkit as tk  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TIKTOKEN_CACHE = os.path.join(REPO, "..", "shared", "tiktoken_cache")
needs_bpe = pytest.mark.skipif(not os.path.isdir(TIKTOKEN_CACHE),
                               reason="GPT-2 BPE files not available offline (../shared/tiktoken_cache)")

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8",
        "--gradient_accumulation_steps=1", "--eval_iters=4", "--log_interval=1", "--num_threads=1",
        "--device=cpu", "--dtype=float32", "--compile=False", "--warmup_iters=5"]


def env():
    e = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    if os.path.isdir(TIKTOKEN_CACHE):
        e["TIKTOKEN_CACHE_DIR"] = os.path.abspath(TIKTOKEN_CACHE)
    return e


def run(script, *args, check=True, extra_env=None):
    cmd = [sys.executable, os.path.join(REPO, script), *args] if script.endswith(".py") else [script, *args]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**env(), **(extra_env or {})},
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def read_log(out_dir, kind):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("type") == kind]


def load_weights(out_dir):
    return tk.load_checkpoint(os.path.join(out_dir, "ckpt.pt"))["model"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The embedded corpus prepared by train.py on first use, and a tiny ToST trained 40 steps."""
    root = tmp_path_factory.mktemp("lm")
    data, out = str(root / "data"), str(root / "out")
    p = run("train.py", "--dataset=pydocs_char", f"--data_dir={data}", f"--out_dir={out}", *TINY,
            "--max_iters=40", "--eval_interval=20", "--learning_rate=1e-2", "--lr_decay_iters=40", "--min_lr=1e-3")
    return dict(data=data, out=out, stdout=p.stdout)


# -----------------------------------------------------------------------------
# embedded corpus, training, sampling, evaluation


def test_embedded_corpus_prepared_on_first_use(tiny_run):
    meta = prep.read_meta(os.path.join(tiny_run["data"], "pydocs_char"))
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == len(meta["chars"])
    train_ids = np.fromfile(os.path.join(tiny_run["data"], "pydocs_char", "train.bin"), dtype=np.uint16)
    assert len(train_ids) == meta["splits"]["train"] > 100_000  # the stdlib's docstrings: over 1M characters
    assert train_ids.max() < meta["vocab_size"]
    text = "".join(meta["chars"][i] for i in train_ids[:20_000])
    assert "Return" in text and "the" in text  # English prose of the docstrings


def test_tiny_tost_loss_goes_down(tiny_run):
    evals = read_log(tiny_run["out"], "eval")
    assert [r["iter"] for r in evals] == [0, 20, 40]
    # untrained: about ln(vocab) = ln(107) = 4.67; 40 steps learn at least the character statistics
    assert evals[0]["val_loss"] > 4.3
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    ckpt = tk.load_checkpoint(os.path.join(tiny_run["out"], "ckpt.pt"))
    assert ckpt["iter_num"] == 40 and ckpt["model_args"]["attn"] == "tssa"
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert ckpt["tokenizer"]["tokenizer"] == "char"
    assert "mfu n/a" in tiny_run["stdout"]  # no MFU on a CPU


def greedy_by_full_forward(model, ids, n_new):
    """Greedy continuation re-running the whole (parallel, non-recurrent) forward every token."""
    idx = torch.tensor([ids])
    for _ in range(n_new):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx[0].tolist()


def test_sample_greedy_matches_full_forward(tiny_run):
    prompt = "Return the"
    p = run("sample.py", f"--out_dir={tiny_run['out']}", f"--start={prompt}", "--num_samples=2",
            "--max_new_tokens=20", "--temperature=0", "--num_threads=1")
    samples = p.stdout.split("-" * 60)[1:-1]
    assert len(samples) == 2 and "tokens/s" in p.stdout
    ckpt = tk.load_checkpoint(os.path.join(tiny_run["out"], "ckpt.pt"))
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    encode, decode = prep.load_tokenizer(ckpt["tokenizer"])
    with torch.no_grad():
        expected = decode(greedy_by_full_forward(model, encode(prompt), 20))
    # sample.py decodes from TSSA's recurrent state; the reference re-runs the parallel form
    assert samples[0].strip("\n") == expected == samples[1].strip("\n")


def test_eval_only_scores_the_whole_split(tiny_run):
    p = run("train.py", "--dataset=pydocs_char", f"--data_dir={tiny_run['data']}", f"--out_dir={tiny_run['out']}",
            "--eval_only=True", "--eval_tokens=2000", "--batch_size=16", "--num_threads=1", "--device=cpu")
    assert "perplexity" in p.stdout
    with open(os.path.join(tiny_run["out"], "log.jsonl")) as f:
        record = [json.loads(line) for line in f][-1]
    assert record["mode"] == "eval_only" and record["tokens"] == 2000
    # independent reference: the first 2001 tokens of val cut into windows of 32, each scored by a plain forward
    ckpt = tk.load_checkpoint(os.path.join(tiny_run["out"], "ckpt.pt"))
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    val = np.fromfile(os.path.join(tiny_run["data"], "pydocs_char", "val.bin"), dtype=np.uint16)[:2001].astype(np.int64)
    total = 0.0
    with torch.no_grad():
        for s in range(0, 2000, 32):
            x, y = torch.from_numpy(val[s:s + 32][None]), torch.from_numpy(val[s + 1:s + 33][None])
            x = x[:, :y.shape[1]]
            _, loss = model(x, y)
            total += loss.item() * y.numel()
    # float32 sums over 2000 tokens in a different order: agree to ~1e-6 relative
    assert record["loss"] == pytest.approx(total / 2000, rel=1e-5)
    assert record["ppl"] == pytest.approx(np.exp(record["loss"]), rel=1e-9)


def test_eval_windows_score_every_prediction_once():
    for n, T, stride in [(10, 4, 4), (10, 4, 2), (100, 32, 7), (33, 32, 32), (5, 32, 16)]:
        scored = []
        for start, skip in train.eval_windows(n, T, stride):
            end = min(start + T, n - 1)
            scored += list(range(start + skip, end))  # prediction i: target token i + 1
            assert skip >= 0 and end > start + skip
        assert scored == list(range(n - 1)), (n, T, stride)


# -----------------------------------------------------------------------------
# exact resume, non-finite loss, killed save


def test_resume_continues_exactly(tiny_run, tmp_path):
    """8 steps in one go == 4 steps, stop, resume in a new process for 4 more: the same loss at
    every step (bit for bit on CPU float32) and the same final weights and optimizer state.
    Dropout is on, so the RNG states must come back too."""
    common = ["--dataset=pydocs_char", f"--data_dir={tiny_run['data']}", *TINY, "--dropout=0.1",
              "--eval_interval=4", "--lr_decay_iters=8", "--learning_rate=3e-3"]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run("train.py", *common, f"--out_dir={full}", "--max_iters=8")
    run("train.py", *common, f"--out_dir={part}", "--max_iters=4")
    assert tk.load_checkpoint(os.path.join(part, "ckpt.pt"))["iter_num"] == 4
    p = run("train.py", *common, f"--out_dir={part}", "--max_iters=8", "--init_from=resume")
    assert "resumed from" in p.stdout
    losses_full = [(r["iter"], r["loss"]) for r in read_log(full, "train")]
    losses_part = [(r["iter"], r["loss"]) for r in read_log(part, "train")]
    assert [i for i, _ in losses_full] == list(range(8))
    assert losses_part == losses_full  # exact equality of the floats
    a, b = (tk.load_checkpoint(os.path.join(d, "ckpt.pt")) for d in (full, part))
    assert a["iter_num"] == b["iter_num"] == 8
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in ("exp_avg", "exp_avg_sq"))


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tiny_run, tmp_path):
    out = str(tmp_path / "out")
    common = ["--dataset=pydocs_char", f"--data_dir={tiny_run['data']}", f"--out_dir={out}", *TINY,
              "--eval_interval=2", "--warmup_iters=0"]
    run("train.py", *common, "--max_iters=2")
    ckpt_path = os.path.join(out, "ckpt.pt")
    before = open(ckpt_path, "rb").read()
    # a learning rate of 1e30 throws the weights to ~1e30; the next forward overflows float32
    p = run("train.py", *common, "--max_iters=6", "--init_from=resume", "--learning_rate=1e30",
            "--decay_lr=False", check=False)
    assert p.returncode == 1
    assert "non-finite training loss" in p.stderr and "last good checkpoint" in p.stderr
    assert "Traceback" not in p.stderr
    assert open(ckpt_path, "rb").read() == before  # untouched: still the iter-2 checkpoint
    ckpt = tk.load_checkpoint(ckpt_path)
    assert ckpt["iter_num"] == 2 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


SAVER = """
import io, sys, time, torch
sys.path.insert(0, {repo!r})
import trainkit as tk
path = sys.argv[1]
tk.save_checkpoint({{"version": 0, "w": torch.zeros(2**20)}}, path)
real_save = torch.save
def torn_save(obj, f):  # write the first half of the bytes, then hang until killed
    buf = io.BytesIO()
    real_save(obj, buf)
    f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
    f.flush()
    print("mid-save", flush=True)
    time.sleep(120)
torch.save = torn_save
tk.save_checkpoint({{"version": 1, "w": torch.ones(2**20)}}, path)
"""


def test_killed_save_leaves_a_loadable_checkpoint(tmp_path):
    """A process killed (SIGKILL, no cleanup) half-way through writing checkpoint 1 leaves
    checkpoint 0 whole and loadable."""
    script = tmp_path / "saver.py"
    script.write_text(SAVER.format(repo=REPO))
    path = str(tmp_path / "ckpt.pt")
    proc = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert proc.stdout.readline().strip() == "mid-save"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    torn = [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]
    assert len(torn) == 1  # the half-written new checkpoint, never renamed over the old one
    ckpt = tk.load_checkpoint(path)
    assert ckpt["version"] == 0 and torch.equal(ckpt["w"], torch.zeros(2**20))


# -----------------------------------------------------------------------------
# distributed data parallel on CPU (gloo)

DDP_WORKER = """
import sys, torch
sys.path.insert(0, {repo!r})
import train, trainkit as tk
C, dist, device, dt = train.setup(sys.argv[1:])
meta = train.ensure_dataset(C, dist)
model = train.train(C, dist, device, dt, meta)
torch.save(model.state_dict(), f"{{C.out_dir}}/rank{{dist.rank}}.pt")  # what each rank ends with
tk.cleanup_distributed(dist)
"""


def test_torchrun_two_processes_match_one(tiny_run, tmp_path):
    """torchrun with 2 gloo processes x 1 micro-batch == 1 process x 2 micro-batches: the same
    sequences every iteration (batches are seeded by their global index), gradients averaged
    across ranks. Both ranks end with identical weights; the checkpoint matches the single
    process run up to float rounding."""
    worker = tmp_path / "ddp_worker.py"
    worker.write_text(DDP_WORKER.format(repo=REPO))
    common = ["--dataset=pydocs_char", f"--data_dir={tiny_run['data']}", *TINY, "--gradient_accumulation_steps=2",
              "--max_iters=6", "--eval_interval=6", "--lr_decay_iters=6", "--learning_rate=3e-3"]
    ddp, single = str(tmp_path / "ddp"), str(tmp_path / "single")
    os.makedirs(ddp)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    p = run(torchrun, "--standalone", "--nproc_per_node=2", str(worker), *common, f"--out_dir={ddp}")
    assert "2 process(es)" in p.stdout
    run("train.py", *common, f"--out_dir={single}")
    r0, r1 = (torch.load(os.path.join(ddp, f"rank{r}.pt")) for r in (0, 1))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # DDP keeps the replicas identical, bit for bit
    ckpt_ddp, ckpt_single = load_weights(ddp), load_weights(single)
    assert all(torch.equal(ckpt_ddp[k], r0[k]) for k in r0)
    # exactly equal, not just close: with two micro-batches the gradient is g0/2 + g1/2 in one
    # process and (g0/2 + g1/2) summed by the all-reduce in the other (DDP divides by the world
    # size first); halving is exact in floating point and a sum of two terms has one order
    assert all(torch.equal(ckpt_ddp[k], ckpt_single[k]) for k in ckpt_single)
    ddp_losses = [r["loss"] for r in read_log(ddp, "train")]
    assert len(ddp_losses) == 6 and ddp_losses == [r["loss"] for r in read_log(single, "train")]
    model = GPT(GPTConfig(**tk.load_checkpoint(os.path.join(ddp, "ckpt.pt"))["model_args"]))
    model.load_state_dict(ckpt_ddp)  # the DDP checkpoint loads into a plain model


# -----------------------------------------------------------------------------
# data preparation


@needs_bpe
def test_prepare_local_text_with_gpt2_bpe_round_trips(tmp_path):
    text = "".join(f"Line {i}: the quick brown fox, café {i * i}\n" + ("\n" if i % 7 == 0 else "")
                   for i in range(400)) + "  last line without newline\t"
    src = tmp_path / "small.txt"
    src.write_text(text, encoding="utf-8")
    data = str(tmp_path / "data")
    args = [f"--input={src}", f"--data_dir={data}", "--num_proc=2"]
    run("prepare_openwebtext.py", *args, extra_env={"HF_DATASETS_CACHE": str(tmp_path / "hf")})
    folder = os.path.join(data, "small")
    meta = prep.read_meta(folder)
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257
    ids = np.concatenate([np.fromfile(os.path.join(folder, f"{s}.bin"), dtype=np.uint16) for s in ("train", "val")])
    assert meta["splits"]["val"] > 0 and len(ids) == meta["splits"]["train"] + meta["splits"]["val"]
    import tiktoken
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.abspath(TIKTOKEN_CACHE))
    assert tiktoken.get_encoding("gpt2").decode(ids.tolist()) == text + "<|endoftext|>"
    # idempotent: the same command again leaves the files alone; other settings need --force
    mtime = os.path.getmtime(os.path.join(folder, "train.bin"))
    p = run("prepare_openwebtext.py", *args)
    assert "already prepared" in p.stdout and os.path.getmtime(os.path.join(folder, "train.bin")) == mtime
    p = run("prepare_openwebtext.py", *args, "--val_fraction=0.5", check=False)
    assert p.returncode != 0 and "--force" in p.stderr


@needs_bpe
def test_prepare_jsonl_splits_documents(tmp_path):
    docs = [f"Document {i} says hello {'world ' * (i % 5)}." for i in range(60)]
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    data = str(tmp_path / "data")
    run("prepare_openwebtext.py", f"--input={src}", f"--data_dir={data}", "--val_fraction=0.1", "--num_proc=1",
        extra_env={"HF_DATASETS_CACHE": str(tmp_path / "hf")})
    import tiktoken
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.abspath(TIKTOKEN_CACHE))
    enc = tiktoken.get_encoding("gpt2")
    split_docs = {}
    for split in ("train", "val"):
        ids = np.fromfile(os.path.join(data, "corpus", f"{split}.bin"), dtype=np.uint16).tolist()
        assert ids[-1] == enc.eot_token
        split_docs[split] = enc.decode(ids).split("<|endoftext|>")[:-1]
    assert len(split_docs["val"]) == 6  # 10% of 60 documents, whole documents
    assert sorted(split_docs["train"] + split_docs["val"]) == sorted(docs)


def test_prepare_text_file_at_character_level(tmp_path):
    text = "Beautiful is better than ugly.\nExplicit is better than implicit. é ü\n" * 40
    src = tmp_path / "zen.txt"
    src.write_text(text, encoding="utf-8")
    meta = prep.prepare(prep.parse_args([f"--input={src}", "--char", f"--data_dir={tmp_path}"]))
    assert meta["dataset"] == "zen_char" and meta["chars"] == "".join(sorted(set(text)))
    ids = np.concatenate([np.fromfile(tmp_path / "zen_char" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    encode, decode = prep.load_tokenizer(meta)
    assert decode(ids.tolist()) == text and encode(text) == ids.tolist()
    assert meta["splits"]["val"] == round(0.1 * len(text))  # one document: val is the last 10%


def test_prepare_fails_fast_offline(tmp_path, monkeypatch):
    # the tokenizer: no cached files and no network -> says where the cache is
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(prep, "reachable", lambda host, **kw: False)
    with pytest.raises(prep.PrepareError, match="TIKTOKEN_CACHE_DIR"):
        prep.gpt2_encoding()
    # the hub: offline and not cached -> suggests local files, within seconds
    t0 = time.time()
    p = run("prepare_openwebtext.py", "--dataset=wikitext2", f"--data_dir={tmp_path}", "--char", check=False,
            extra_env={"HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_HOME": str(tmp_path / "hfhome")})
    assert p.returncode != 0 and "--input" in p.stderr and "Traceback" not in p.stderr
    assert time.time() - t0 < 60


# -----------------------------------------------------------------------------
# configuration errors


def test_config_errors_are_clear(tmp_path):
    defaults = train.DEFAULTS
    assert "MODEL_KEYS" not in defaults and "out_dir" in defaults  # only the settings block
    c = tk.configure(defaults, ["--dropout=0", "--compile=false", "--max_iters=1e3"])
    assert c["dropout"] == 0.0 and isinstance(c["dropout"], float) and c["compile"] is False
    assert c["max_iters"] == 1000
    with pytest.raises(tk.ConfigError, match="expects float"):
        tk.configure(defaults, ["--learning_rate=fast"])
    bad = tmp_path / "bad.py"
    bad.write_text("n_layers = 4\n")
    with pytest.raises(tk.ConfigError, match="n_layer"):  # suggests the close match
        tk.configure(defaults, [str(bad)])
    p = run("train.py", "--n_embed=64", check=False)
    assert p.returncode != 0 and "unknown config key 'n_embed'" in p.stderr and "n_embd" in p.stderr
    assert "Traceback" not in p.stderr
    p = run("train.py", f"--data_dir={tmp_path}", "--dataset=nothing_here", "--device=cpu", check=False)
    assert p.returncode != 0 and "prepare_openwebtext.py --dataset=nothing_here" in p.stderr
