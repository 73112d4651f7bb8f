"""
Sample text from a checkpoint written by train.py (ToST or the softmax baseline).

    python sample.py --out_dir=out-pydocs-char-tost
    python sample.py --out_dir=out-tost-owt --start="The meaning of life is" --num_samples=3
    python sample.py --out_dir=out-tost-owt --start=FILE:prompt.txt --temperature=0.8 --top_k=200

The tokenizer (characters, or GPT-2 BPE through tiktoken) is the one the checkpoint names.
ToST decodes from its recurrent state: three running sums per head, so every new token costs
the same whatever the length so far (no growing KV cache); the softmax baseline uses a KV
cache. The ids that only pad the vocabulary to a multiple of 64 are never sampled. The script
reports tokens per second. Settings are globals overridden by --key=value (as in train.py).
"""

import os
import sys
import time

import torch

import trainkit as tk
import kernels
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
out_dir = "out"  # folder holding ckpt.pt
ckpt_path = ""  # or the checkpoint file itself
start = "\n"  # prompt, or "FILE:path" to read it from a file
num_samples = 3  # samples drawn (as one batch)
max_new_tokens = 500
temperature = 0.8  # 1.0: the model's distribution; lower: more conservative; 0: greedy
top_k = 200  # sample among the top_k most likely tokens (0: all)
seed = 1337
device = "auto"  # "auto" (cuda if available), "cpu", "cuda", ...
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, float32 on CPU), "float32", "bfloat16", "float16"
compile = False
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
num_threads = 0  # torch CPU threads (0: the training run's setting, else torch's default)
# -----------------------------------------------------------------------------


def load_tokenizer(info):
    """(encode, decode) for the tokenizer a checkpoint (or meta.json) names: "char" (info
    carries the characters, token i is character i) or "gpt2" (tiktoken)."""
    if info["tokenizer"] == "char":
        chars = info["chars"]
        stoi = {ch: i for i, ch in enumerate(chars)}

        def encode(text):
            missing = sorted(set(text) - stoi.keys())
            if missing:
                raise tk.UserError(f"the prompt has characters {''.join(missing)!r} that are not in this model's "
                                   f"vocabulary ({len(chars)} characters of its training text)")
            return [stoi[ch] for ch in text]

        return encode, lambda ids: "".join(chars[i] for i in ids)
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})), enc.decode


def main(argv):
    C, _ = tk.configure(tk.config_defaults(globals()), argv)
    tk.check(C, at_least_1=("num_samples",), non_negative=("max_new_tokens", "temperature", "top_k", "num_threads"),
             choices={"tssa_impl": kernels.IMPLS})
    dev, dt = tk.choose_device_dtype(C.device, C.dtype)
    torch.manual_seed(C.seed)

    # the model and its tokenizer, from the checkpoint
    path = C.ckpt_path or os.path.join(C.out_dir, "ckpt.pt")
    ckpt = tk.load_checkpoint(path, "language")
    threads = C.num_threads or ckpt.get("config", {}).get("num_threads", 0)
    if threads > 0:  # a small model on a busy CPU: one thread is far faster than contending ones
        torch.set_num_threads(threads)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    kernels.use(model, C.tssa_impl).to(dev).eval()
    if C.compile:
        model = torch.compile(model)
    info = ckpt["tokenizer"]
    encode, decode = load_tokenizer(info)

    # the prompt, repeated once per sample: (num_samples, T)
    prompt = C.start
    if prompt.startswith("FILE:"):
        with open(prompt[len("FILE:"):], encoding="utf-8") as f:
            prompt = f.read()
    ids = encode(prompt)
    tk.require(len(ids) > 0, "the prompt is empty: give at least one character/token with --start")
    idx = torch.tensor([ids] * C.num_samples, dtype=torch.long, device=dev)

    ctx = torch.autocast("cuda" if dev.startswith("cuda") else "cpu", dtype=tk.DTYPES[dt], enabled=dt != "float32")
    c = model.config
    print(f"{path} (iter {ckpt.get('iter_num')}): {c.attn}, {c.n_layer} layers, {c.n_embd} wide, block "
          f"{c.block_size}, {info['tokenizer']} tokenizer; {C.num_samples} samples of {C.max_new_tokens} "
          f"tokens on {dev}")
    t0 = time.time()
    with torch.no_grad(), ctx:
        out = model.generate(idx, C.max_new_tokens, temperature=C.temperature, top_k=C.top_k or None,
                             n_vocab=info["vocab_size"])
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.time() - t0
    for row in out.tolist():
        print("-" * 60)
        print(decode(row))
    print("-" * 60)
    n = C.num_samples * C.max_new_tokens
    print(f"{n:,} tokens in {seconds:.2f}s: {n / max(seconds, 1e-9):,.0f} tokens/s "
          f"({C.num_samples} samples decoded together)")
    return out


if __name__ == "__main__":
    tk.run_cli(main, sys.argv[1:])
