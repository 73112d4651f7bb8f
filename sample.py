"""
Sample text from a checkpoint written by train.py (ToST or the softmax baseline).

    python sample.py --out_dir=out-pydocs-char-tost
    python sample.py --out_dir=out-tost-owt --start="The meaning of life is" --num_samples=3
    python sample.py --out_dir=out-tost-owt --start=FILE:prompt.txt --temperature=0.8 --top_k=200

The tokenizer (characters or GPT-2 BPE) comes from the checkpoint. ToST decodes from its
recurrent state: three running sums per head, so every new token costs the same whatever the
length so far (no growing KV cache); the softmax baseline uses a KV cache. The script reports
tokens per second. Settings are globals overridden by --key=value (as in train.py).
"""

import os
import sys
import time

import torch

import trainkit as tk
from model import GPT, GPTConfig
from prepare_openwebtext import PrepareError, load_tokenizer

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
num_threads = 0  # torch CPU threads (0: torch's default)
# -----------------------------------------------------------------------------


def load_model(path, device):
    """The GPT in a train.py checkpoint, on `device`, in eval mode, and its tokenizer info."""
    ckpt = tk.load_checkpoint(path)
    if "model_args" not in ckpt or "tokenizer" not in ckpt:
        raise ValueError(f"{path} is not a language-model checkpoint of train.py (no model_args / tokenizer)")
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(tk.clean_state_dict(ckpt["model"]))
    return model.to(device).eval(), ckpt["tokenizer"], ckpt.get("iter_num")


def read_prompt(text):
    if text.startswith("FILE:"):
        with open(text[len("FILE:"):], encoding="utf-8") as f:
            return f.read()
    return text


def main(argv):
    C = tk.configure(tk.config_defaults(globals()), argv)
    if C["num_threads"] > 0:
        torch.set_num_threads(C["num_threads"])
    dev = C["device"] if C["device"] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dt = C["dtype"]
    if dt == "auto":
        dt = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if dev.startswith("cuda") else "float32"
    torch.manual_seed(C["seed"])
    path = C["ckpt_path"] or os.path.join(C["out_dir"], "ckpt.pt")
    model, tok_info, iters = load_model(path, dev)
    if C["compile"]:
        model = torch.compile(model)
    encode, decode = load_tokenizer(tok_info)
    prompt = read_prompt(C["start"])
    ids = encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty: give at least one character/token with --start")
    idx = torch.tensor([ids] * C["num_samples"], dtype=torch.long, device=dev)  # (B, T)
    ctx, _ = tk.autocast_for(dev, dt)
    c = model.config
    print(f"{path} (iter {iters}): {c.attn}, {c.n_layer} layers, {c.n_embd} wide, block {c.block_size}, "
          f"{tok_info['tokenizer']} tokenizer; {C['num_samples']} samples of {C['max_new_tokens']} tokens on {dev}")
    t0 = time.time()
    with torch.no_grad(), ctx():
        out = model.generate(idx, C["max_new_tokens"], temperature=C["temperature"], top_k=C["top_k"] or None)
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    dt_s = time.time() - t0
    for row in out.tolist():
        print("-" * 60)
        print(decode(row))
    print("-" * 60)
    n = C["num_samples"] * C["max_new_tokens"]
    print(f"{n:,} tokens in {dt_s:.2f}s: {n / dt_s:,.0f} tokens/s ({C['num_samples']} samples decoded together)")
    return out


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (tk.ConfigError, FileNotFoundError, ValueError, PrepareError) as e:
        sys.exit(f"sample.py: {e}")
