"""
Decoding cost of every variant: milliseconds per generated token and bytes of the decoding
state, after a prompt of T tokens, for the pydocs character-level layout (config/pydocs_char_*.py:
width 96, 4 heads; 6 layers for the ToST variants and the hybrid, 5 for softmax and linear
attention, the equal-parameter pairing of the README). Untrained weights: the cost does not
depend on their values. Prints a table and writes JSON.

    python results/recall/decode_bench.py                               # T = 128, 1024, 4096 into out-recall/decode_cpu.json
    python results/recall/decode_bench.py --out=results/recall/decode_cpu.json   # the table of results/recall/README.md
    python results/recall/decode_bench.py --T=128,1024 --steps=100 --out=/tmp/decode.json

Each case: a prefill of T tokens through GPT.prefill (parallel), then `steps` tokens
one at a time; the median over `repeats` of the per-token time. The state bytes are what
the model carries after the T tokens of the prompt (KV caches grow with T; TSSA and linear
attention do not): a KV cache's buffers are allocated for the whole block, of which the T
filled positions are counted. Nothing the repository ships is an output default: the JSON
goes to out-recall/ unless --out names the committed file.
"""

import os
import statistics
import sys
import time

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from model import GPT, GPTConfig, KVCache
from nanotost import atomic, cli, lists, outputs, portable

# -----------------------------------------------------------------------------
T = "128,1024,4096"  # prompt lengths (the decoding context)
steps = 50  # tokens decoded per timing
repeats = 3
batch_size = 1
num_threads = 1
out = "out-recall/decode_cpu.json"  # the README's command names results/recall/decode_cpu.json
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())

LAYOUT = dict(vocab_size=128, n_head=4, n_embd=96)  # pydocs_char: 107 characters, padded to 128
VARIANTS = {  # name -> GPTConfig fields, config/pydocs_char_*.py's layout (the first screen trains tost_conv)
    "tost": dict(n_layer=6, attn="tssa"),
    "tost_uniform": dict(n_layer=6, attn="tssa", pi="uniform"),
    "tost_conv": dict(n_layer=6, attn="tssa", short_conv=4),
    "hybrid": dict(n_layer=6, attn="tssa", hybrid_every=2),
    "hybrid_conv": dict(n_layer=6, attn="tssa", hybrid_every=2, short_conv=4),
    "softmax": dict(n_layer=5, attn="softmax", layer_scale_init=None),
    "linear": dict(n_layer=5, attn="linear", layer_scale_init=None),
}


LABELS = {"tost": "ToST", "tost_uniform": "ToST, uniform Pi", "tost_conv": "ToST + short_conv(4)",
          "hybrid": "hybrid (every 2nd block softmax)", "hybrid_conv": "hybrid + short_conv(4)",
          "softmax": "softmax attention", "linear": "linear attention"}


def state_bytes(layers, T_):
    """Bytes of the layers' decoding states holding T_ tokens: a KV cache counts its T_ filled
    positions of the max_len allocated; the other states do not depend on T_."""
    total = 0
    for layer in layers:
        if isinstance(layer, KVCache):
            total += layer.nbytes() * T_ // layer.max_len
        else:
            total += layer.nbytes()
    return total


@torch.no_grad()
def measure(name, T_, cfg):
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=T_ + cfg.steps, **LAYOUT, **VARIANTS[name])).eval()
    prompt = torch.randint(0, 107, (cfg.batch_size, T_))
    times = []
    for _ in range(cfg.repeats):
        state = m.init_state(cfg.batch_size)
        logits = m.prefill(prompt, state)
        size = state_bytes(state.layers, T_)
        t0 = time.perf_counter()
        for t in range(cfg.steps):
            tok = logits.argmax(-1, keepdim=True)  # (B, 1) greedy
            logits = m.step(tok, state)
        times.append((time.perf_counter() - t0) / cfg.steps)
    return dict(variant=name, T=T_, ms_per_token=round(1000 * statistics.median(times), 3),
                state_bytes_after_prompt=size, state_bytes_per_sequence=size // cfg.batch_size,
                params=m.get_num_params(non_embedding=True), n_layer=m.config.n_layer)


def main(argv):
    cfg, _ = cli.configure(SETTINGS, argv)
    cli.check(cfg, at_least_1=("steps", "repeats", "batch_size"), non_negative=("num_threads",))
    lengths = cli.parse_list("T", cfg.T, int)
    cli.require(min(lengths) >= 1, f"T must be positive lengths: {lists.few(str(n) for n in lengths if n < 1)} is not")
    cli.require(not os.path.isdir(cfg.out), f"out is a folder ({cfg.out}); give a file name (\"\" for none)")
    if cfg.out:  # one writer at a time, and a place that can be written, before anything is measured
        outputs.claim_output(cfg.out, "--out=<another file>")
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    rows = []
    print(f"{'variant':<14}{'T':>6}{'ms/token':>10}{'state bytes':>14}{'params*':>10}")
    for name in VARIANTS:
        for T_ in lengths:
            r = measure(name, T_, cfg)
            rows.append(r)
            print(f"{name:<14}{T_:>6}{r['ms_per_token']:>10.3f}{r['state_bytes_per_sequence']:>14,}{r['params']:>10,}",
                  flush=True)
    load = portable.load_average()
    if cfg.out:
        atomic.write_json(cfg.out, dict(settings=vars(cfg), rows=rows, loadavg=load, torch=torch.__version__, labels=LABELS))
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return rows


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
