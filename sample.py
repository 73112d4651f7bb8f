"""
Sample text from a checkpoint written by train.py (ToST or the softmax baseline), or a model export.py wrote.

    python sample.py --out_dir=out-pydocs-char-tost
    python sample.py --out_dir=out-tost-owt --start="The meaning of life is" --num_samples=3
    python sample.py --out_dir=out-tost-owt --start=FILE:prompt.txt --temperature=0.8 --top_k=200

ToST decodes from its recurrent state: three running sums per head, so every new token costs
the same whatever the length so far (no growing KV cache); the softmax baseline uses a KV
cache. --cuda_graph=auto (the default) records one decoding step as a CUDA graph on a GPU and
replays it for every token (one launch instead of one per operation); =compiled and =autotuned
compile the step first (Inductor; autotuned times its kernel choices, fewer kernels a token, minutes
to build); on the CPU, and with --cuda_graph=off, each step runs op by op. The tokenizer is the
one the checkpoint names; the ids that only pad the vocabulary to a multiple of 64 are never sampled. --temperature=0 is
greedy, and a tiny one (1e-9, 1e-40) tends to it, never to nan; --top_k=0 is no limit.
Settings are globals overridden by --key=value (as in train.py).
"""

import sys
import time

import torch

import kernels
from nanotost import cli, devices, forks, loading
from nanotost import textdata as td

# -----------------------------------------------------------------------------
out_dir = "out"  # folder holding ckpt.pt
ckpt_path = ""  # or the checkpoint file itself
init_from = ""  # or a model export.py wrote: its folder, or its Hugging Face Hub id (export.py says how)
start = "\n"  # prompt, or "FILE:path" to read it from a file
num_samples = 3  # samples drawn (as one batch)
max_new_tokens = 500
temperature = 0.8  # 1.0: the model's distribution; lower: more conservative; 0 (or tiny, e.g. 1e-9): greedy
top_k = 200  # sample among the top_k most likely tokens (0: all)
seed = 1337
device = "auto"  # "auto" (cuda if available, else mps on Apple silicon, else cpu), "cpu", "cuda", "mps"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, float32 on CPU), "float32", "bfloat16", "float16"
cuda_graph = "auto"  # "auto": each step a CUDA graph on CUDA; "compiled", "autotuned": compiled first; "off"
compile = False
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
num_threads = 0  # torch CPU threads (0: the training run's setting, else the machine's free cores)
# -----------------------------------------------------------------------------


def main(argv):
    cfg, given = cli.configure(cli.config_defaults(globals()), argv)
    cli.check(cfg, at_least_1=("num_samples",), non_negative=loading.SAMPLING_SETTINGS, seed=("seed",),
              workers=("num_threads",), choices={"tssa_impl": kernels.IMPLS, "cuda_graph": (*kernels.CAPTURES, "off")})
    device, dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    torch.manual_seed(cfg.seed)

    # the model, from the checkpoint (or the folder export.py wrote), and how it generates: from its
    # decoding state; a fork whose decoding differs from its parallel form is said, and sampled by the latter
    model, ckpt, path = loading.load_reader_model(cfg, device, given)
    generate = forks.generator(model, "sampling by the parallel form instead (a full forward per token)")
    if cfg.cuda_graph != "off":  # on CUDA, each step is one replay of a recorded graph
        kernels.capture_steps(model, **kernels.CAPTURES[cfg.cuda_graph])
    if cfg.compile:
        model = torch.compile(model)
    info = ckpt["tokenizer"]
    encode, decode = td.load_tokenizer(info)

    # the prompt, repeated once per sample: (num_samples, T)
    ids = encode(loading.prompt_text(cfg.start))  # the text given, or the file that FILE:path names
    cli.require(len(ids) > 0, "the prompt is empty: give at least one character/token with --start")
    idx = torch.tensor([ids] * cfg.num_samples, dtype=torch.long, device=device)

    # generate: the prompt in parallel, then one step per token from the decoding state
    ctx = torch.autocast(device.split(":")[0], dtype=devices.DTYPES[dtype], enabled=dtype != "float32")
    c = model.config
    print(f"{path} (iter {ckpt['iter_num']}): {c.attn}, {c.n_layer} layers, {c.n_embd} wide, block "
          f"{c.block_size}, {info['tokenizer']} tokenizer; {cfg.num_samples} samples of {cfg.max_new_tokens} "
          f"tokens on {device}")
    t0 = time.time()
    with torch.no_grad(), ctx:
        out = generate(idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k or None,
                       tokenizer_vocab_size=info["vocab_size"])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.time() - t0
    for row in out.tolist():
        print("-" * 60)
        print(decode(row))
    print("-" * 60)
    n = cfg.num_samples * cfg.max_new_tokens
    print(f"{n:,} tokens in {seconds:.2f}s: {n / max(seconds, 1e-9):,.0f} tokens/s "
          f"({cfg.num_samples} samples decoded together)")
    return out


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
