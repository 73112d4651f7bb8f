"""
SPEED.md's GPU tables, rendered from the JSON that `python bench.py --report` writes
(results/<gpu>.json): every figure in those tables comes from that file, by this script.

    python results/speed_tables.py                  # rewrite SPEED.md's tables from REPORT
    python results/speed_tables.py --check          # exit 1 naming each table SPEED.md has otherwise
    python results/speed_tables.py --report=out-bench/cpu-report.json --print   # any report, to stdout

A table sits in SPEED.md between `<!-- table: NAME -->` and `<!-- /table -->`; TABLES maps
NAME to a function of the report's JSON (data -> markdown). With no report at REPORT the tables
say so. Ratios are worded as they read: "2.0x faster than", "3.3x slower than". Standard
library only (results/render.py, when it lands, registers these functions by NAME).
"""

import json
import os
import re
import sys

REPORT = "results/nvidia-h100-80gb-hbm3.json"  # the committed GPU report SPEED.md shows
# the targets of issue 25 (bf16, one H100); None: no target for that row
OP_TARGETS = {(1, 16384): 0.15, (16, 1024): 0.2}  # TSSA fwd+bwd GPU busy ms
TRAIN_TARGETS = {4096: 0.75, 16384: 0.45, 65536: 0.2}  # ToST / faster GPT-2 step time
DECODE_TARGET_MS, DECODE_FLAT = 1.0, 0.10  # ToST per token, and max/min - 1 from 1K to 64K
MAIN_JOB_TARGET = 600e3  # tokens/s on one H100
OP_IMPLS = {"triton": "TSSA `triton`", "compiled": "TSSA `torch` compiled", "torch": "TSSA `torch` eager",
            "cpu": "TSSA `cpu`", "sdpa_flash": "SDPA FlashAttention-2", "sdpa_cudnn": "SDPA cuDNN",
            "sdpa": "SDPA (its own choice)"}


def ratio_words(ours, theirs, name):
    """ours vs theirs (times: smaller is faster) the way it reads: "2.0x faster than NAME",
    "3.3x slower than NAME" (never "0.3x faster"), "as fast as NAME" within 5%."""
    if ours <= 0 or theirs <= 0:
        return f"not comparable with {name}"
    r = theirs / ours
    if abs(r - 1) < 0.05:
        return f"as fast as {name}"
    return f"{r:.1f}x faster than {name}" if r > 1 else f"{1 / r:.1f}x slower than {name}"


def num(x, unit=""):
    """3 significant digits, thousands separated: 0.0123, 1.23, 12.3, 123, 1,234."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}{unit}"
    return f"{x:.3g}{unit}" if abs(x) >= 0.01 else f"{x:.2g}{unit}"


def section(data, name):
    return (data.get("sections") or {}).get(name) or dict(status="not_run", rows=[])


def ok(row):
    return row is not None and row.get("status") == "ok"


class Notes:
    """Footnotes for cells that hold no figure: '(1)' in the cell, '(1) skipped: why' below."""

    def __init__(self):
        self.items = []

    def mark(self, row):
        text = f"{row.get('status', 'missing').replace('_', ' ')}: {row.get('reason', '')}".rstrip(": ")
        if text not in self.items:
            self.items.append(text)
        return f"{row.get('status', '').replace('_', ' ')} ({self.items.index(text) + 1})"

    def text(self):
        return "".join(f"\n({i + 1}) {t}" for i, t in enumerate(self.items)).replace("\n", "  \n", len(self.items))


def section_line(data, names):
    """One line per named section that is not ok: what happened to it."""
    lines = []
    for name in names:
        s = section(data, name)
        if s.get("status") != "ok":
            what = {"timed_out": f"timed out at its limit of {s.get('limit_s', 0):.0f} s (the rows it measured "
                                 f"are shown)", "not_run": "has not run", "failed": "failed",
                    "skipped": "was skipped"}.get(s.get("status"), s.get("status"))
            lines.append(f"Section `{name}` {what}" + (f": {s['reason']}" if s.get("reason") else "") + ".")
    return "\n".join(lines) + ("\n\n" if lines else "")


def judge(data, target, value, meets, text):
    """A target cell: 'TEXT: met' / 'TEXT: not met'; '-' where there is no target; the targets
    are for one H100 in bf16, so a CPU or quick report says 'n/a'."""
    if target is None:
        return "-"
    m = data.get("meta", {})
    if not m.get("gpu") or m.get("quick"):
        return f"{text}: n/a (a {'quick' if m.get('quick') else 'CPU'} report)"
    if value is None or value is False:
        return f"{text}: not measured"
    return f"{text}: {'met' if meets(value, target) else 'not met'}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def table_gpu_meta(data):
    """Where and with what the report was measured, and each section's fate."""
    m = data.get("meta", {})
    commit = (m.get("commit") or "unknown")[:12] + (" (with uncommitted changes)" if m.get("dirty") else "")
    rows = [("device", f"{m.get('name')}" + (f", driver {m['driver']}" if m.get("driver") else "")
             + (f", {m['gpu_memory_gib']} GiB, {m['sm_count']} SMs" if m.get("sm_count") else "")),
            ("software", f"torch {m.get('torch')}, CUDA {m.get('cuda')}, Triton {m.get('triton')}, "
                         f"cuDNN {m.get('cudnn')}, Python {m.get('python')}"),
            ("code", f"commit {commit}, source sha256 {m.get('source_sha256')}"),
            ("date (UTC)", m.get("date")),
            ("dtype", f"{m.get('dtype')}" + (" (quick: tiny shapes)" if m.get("quick") else ""))]
    secs = []
    for name, s in (data.get("sections") or {}).items():
        if name == "meta":
            continue
        counts = {}
        for r in s.get("rows", []):
            counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
        secs.append((f"`{name}`", s.get("status", "").replace("_", " "),
                     f"{s['wall_s']:.0f} s of {s['limit_s']:.0f}" if s.get("wall_s") is not None else "-",
                     ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()) or "-",
                     (s.get("started") or "-") + (f", {s['commit'][:8]}" if s.get("commit") else "")))
    return table(["", ""], rows) + "\n\n" + table(["section", "status", "time (limit)", "rows", "started, commit"],
                                                   secs)


def table_gpu_op(data):
    """The operator fwd+bwd: GPU busy / wall ms per call and kernels per call, per implementation."""
    rows = section(data, "op").get("rows", [])
    impls = [i for i in OP_IMPLS if any(r.get("impl") == i for r in rows)]
    shapes = sorted({(r["B"], r["T"]) for r in rows}, key=lambda s: (s[0] > 1, s[1]))
    notes = Notes()
    body = []
    for B, T in shapes:
        cells, best, sdpa = [], None, None
        for impl in impls:
            r = next((r for r in rows if (r.get("impl"), r["B"], r["T"]) == (impl, B, T)), None)
            if not ok(r):
                cells.append(notes.mark(r) if r else "-")
                continue
            ran = f", {r['backend_ran']}" if impl.startswith("sdpa") and r.get("backend_ran") else ""
            cells.append(f"{num(r.get('gpu_ms'))} / {num(r['ms'])} ({num(r.get('kernels'))}{ran})")
            t = r.get("gpu_ms") if r.get("gpu_ms") is not None else r["ms"]
            side = "sdpa" if impl.startswith("sdpa") else "tssa"
            if side == "tssa" and (best is None or t < best[0]):
                best = (t, impl)
            if side == "sdpa" and (sdpa is None or t < sdpa[0]):
                sdpa = (t, impl)
        vs = f"`{best[1]}` {ratio_words(best[0], sdpa[0], OP_IMPLS[sdpa[1]])}" if best and sdpa else "-"
        goal = judge(data, OP_TARGETS.get((B, T)), best and best[0], lambda x, t: x <= t,
                     f"<= {OP_TARGETS.get((B, T))} ms")
        body.append([f"B={B}, T={T:,}"] + cells + [vs, goal])
    s = section(data, "op")
    head = section_line(data, ["op"])
    if not rows:
        return head.strip() or "No rows."
    head += (f"fwd+bwd, causal, {s.get('H')} heads of {s.get('p')}, {s.get('dtype')}. Each cell: GPU busy ms / wall "
             "ms per call (kernels launched per call); the comparison uses GPU time where it was measured.\n\n")
    return head + table(["shape"] + [OP_IMPLS[i] for i in impls] + ["best TSSA vs faster SDPA", "target"],
                        body) + notes.text()


def table_gpu_train(data):
    """The training step of ToST-Base vs GPT-2 Base, equal tokens per step."""
    cols = [("train_tost", None, "ToST-Base `torch`"), ("train_tost_triton", None, "ToST-Base `triton`"),
            ("train_gpt2_flash", "flash", "GPT-2 FlashAttention-2"), ("train_gpt2_cudnn", "cudnn", "GPT-2 cuDNN"),
            ("train_gpt2_flash", "default", "GPT-2 (SDPA's own choice)")]
    found = {}
    for sec, backend, label in cols:
        for r in section(data, sec).get("rows", []):
            if backend is None or r.get("backend") == backend:
                found.setdefault(label, {})[(r["T"], r["B"])] = r
    labels = [label for _, _, label in cols if label in found]
    shapes = sorted({k for rows in found.values() for k in rows})
    notes = Notes()
    body = []
    for T, B in shapes:
        cells, tost, gpt2, mem = [], None, None, {}
        for label in labels:
            r = found[label].get((T, B))
            if not (ok(r) or (r and r.get("status") == "eager")):  # eager: its compile failed, said in a note
                cells.append(notes.mark(r) if r else "-")
                continue
            ran = f" ({r['backend_ran']})" if r.get("backend_ran") else ""
            cells.append(f"{num(r['ms'])} ms{ran}" + (f", {notes.mark(r)}" if r["status"] == "eager" else ""))
            if label.startswith("ToST") and (tost is None or r["ms"] < tost[0]):
                tost = (r["ms"], label)
            if label.startswith("GPT-2") and (gpt2 is None or r["ms"] < gpt2[0]):
                gpt2 = (r["ms"], label)
            if r.get("peak_mb") is not None:
                mem[label[:4]] = min(mem.get(label[:4], 1e18), r["peak_mb"])
        ratio = tost[0] / gpt2[0] if tost and gpt2 else None
        vs = f"{ratio:.2f}x the time: {ratio_words(tost[0], gpt2[0], 'GPT-2')}" if ratio else "-"
        goal = judge(data, TRAIN_TARGETS.get(T), ratio, lambda r, t: r <= t, f"<= {TRAIN_TARGETS.get(T)}x")
        peak = f"{num(mem['ToST'] / 1024)} / {num(mem['GPT-'] / 1024)}" if "ToST" in mem and "GPT-" in mem else "-"
        body.append([f"{T:,} x {B}"] + cells + [vs, goal, peak])
    head = section_line(data, ["train_tost", "train_gpt2_flash", "train_gpt2_cudnn"])
    if not body:
        return head.strip() or "No rows."
    s = next(section(data, n) for n in ("train_tost", "train_gpt2_flash", "train_gpt2_cudnn", "train_tost_triton")
             if section(data, n).get("train_tokens"))
    peak_is = next((r["peak_is"] for rows in found.values() for r in rows.values() if r.get("peak_is")), "-")
    head += (f"Forward, backward and AdamW of one step of {s['train_tokens']:,} tokens (T x B), "
             f"{'compiled (torch.compile, a fresh compile per row)' if s.get('compiled') else 'eager'}, "
             f"{s.get('dtype') + ' autocast' if s.get('dtype') != 'float32' else 'float32'}; ms per step (the attention kernel that ran). Peak GB, ToST / GPT-2: "
             f"{peak_is}.\n\n")
    return head + table(["T x B"] + labels + ["ToST / faster GPT-2", "target", "peak GB"], body) + notes.text()


def table_gpu_decode(data):
    """Per-token decoding at each context: ToST's constant state vs GPT-2's static KV cache."""
    rows = section(data, "decode").get("rows", [])
    kinds = [("tost", "eager", "ToST-Base eager"), ("tost", "captured", "ToST-Base CUDA graph"),
             ("gpt2", "eager", "GPT-2 eager"), ("gpt2", "captured", "GPT-2 CUDA graph")]
    contexts = sorted({r["T"] for r in rows})
    notes = Notes()
    body, per_kind = [], {k: [] for k in kinds}
    for T in contexts:
        cells = []
        for kind in kinds:
            r = next((r for r in rows if (r.get("arch"), r.get("mode"), r["T"]) == (kind[0], kind[1], T)), None)
            if not ok(r):
                cells.append(notes.mark(r) if r else "-")
                continue
            per_kind[kind].append(r["ms"])
            cells.append(f"{num(r['ms'])} ({num(r.get('gpu_ms'))}, {num(r.get('kernels'))}); "
                         f"{num(r.get('state_mb'))} MB")
        body.append([f"{T:,}"] + cells)
    spread = []
    for kind in kinds:
        ms = per_kind[kind]
        spread.append(f"{max(ms) / min(ms):.2f}x" if len(ms) > 1 else "-")
    body.append(["max / min over contexts"] + spread)
    goal = ""
    if len(per_kind[kinds[1]]) > 1:
        ms = per_kind[kinds[1]]
        flat = max(ms) / min(ms) - 1
        verdict = judge(data, DECODE_TARGET_MS, (max(ms), flat), lambda x, t: x[0] <= t and x[1] <= DECODE_FLAT, "")
        goal = (f"\n\nTarget: ToST <= {DECODE_TARGET_MS} ms per token and flat within {DECODE_FLAT:.0%} from the "
                f"shortest to the longest context (CUDA graph): {num(max(ms))} ms at most, spread {flat:.0%}"
                f"{verdict}.")
    dtype = next((r["dtype"] for r in rows if r.get("dtype")), "?")
    if not rows:
        return section_line(data, ["decode"]).strip() or "No rows."
    head = section_line(data, ["decode"]) + (f"One token after a context of T tokens, batch 1, weights in {dtype}. "
                                            "Each cell: wall ms per token (GPU busy ms, kernels per token); the "
                                            "state the model carries.\n\n")
    return head + table(["context"] + [k[2] for k in kinds], body) + notes.text() + goal


def table_gpu_main_job(data):
    """The main job's throughput: train.py on config/tost_owt.py."""
    s = section(data, "main_job")
    rows = s.get("rows", [])
    notes = Notes()
    body = []
    for r in rows:
        if not ok(r):
            body.append([r.get("config", "-"), notes.mark(r), "-", "-", "-", "-"])
            continue
        tps = r.get("tokens_per_s")
        goal = judge(data, MAIN_JOB_TARGET, tps, lambda x, t: x >= t, f">= {MAIN_JOB_TARGET / 1e3:.0f}K")
        body.append([f"`{r['config']}`, {'compiled' if r.get('compiled') else 'eager'}",
                     f"{r['iters']} ({r['iters_logged']} logged)", num(r.get("tokens_per_iter")),
                     f"{num(tps)} (median from iter {r['steady_from_iter']})",
                     f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else f"- ({r.get('mfu_note', '')})", goal])
    if not rows:
        return section_line(data, ["main_job"]).strip() or "No rows."
    head = section_line(data, ["main_job"]) + f"`{s.get('command')}` on {s.get('data')}.\n\n"
    return head + table(["job", "iterations", "tokens / iteration", "tokens/s", "MFU", "target"], body) + notes.text()


def table_gpu_check(data):
    """kernels/gpu_check.py: accuracy against float64 and determinism, as it reported them."""
    out = section_line(data, ["gpu_check_accuracy", "gpu_check_determinism"])
    acc = [r for r in section(data, "gpu_check_accuracy").get("rows", []) if ok(r)]
    if acc:
        keys = [k for k in ("out", "dw", "dtemp", "dbias") if any(k in r for r in acc)]
        out += table(["shape (B, H, T, p)", "impl"] + keys,
                     [[", ".join(map(str, r.get("shape", []))), r.get("impl", "-")]
                      + [f"{r[k]:.1e}" if isinstance(r.get(k), (int, float)) else "-" for k in keys] for r in acc])
        out += "\n\nRelative RMS error against the float64 reference.\n"
    for r in section(data, "gpu_check_determinism").get("rows", []):
        if ok(r) and "identical" in r:
            same = r["identical"]
            out += ("\nTwo fwd+bwd runs at the training shape, bf16: out, dw, dtemp, dbias bit-identical: "
                    + ", ".join("yes" if x else "NO" for x in same) + ".\n")
    return out.strip() or "No gpu_check rows."


TABLES = {"gpu_meta": table_gpu_meta, "gpu_op": table_gpu_op, "gpu_train": table_gpu_train,
          "gpu_decode": table_gpu_decode, "gpu_main_job": table_gpu_main_job, "gpu_check": table_gpu_check}
BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def render_doc(text, data, report):
    """text with every registered table block rewritten; the names of the blocks that changed."""
    changed = []

    def one(m):
        name = m.group(2)
        if name not in TABLES:
            return m.group(0)
        body = TABLES[name](data) if data is not None else (
            f"_No GPU report is committed yet ({report}): `python bench.py --report` on a GPU writes it "
            "(SPEED.md, The GPU report)._")
        new = m.group(1) + body.rstrip() + "\n" + m.group(4)
        if new != m.group(0):
            changed.append(name)
        return new
    return BLOCK.sub(one, text), changed


def main(argv):
    opts = dict(report=REPORT, doc="SPEED.md", check=False, print=False)
    for arg in argv:
        key, sep, value = arg.lstrip("-").partition("=")
        if key not in opts or (key in ("check", "print") and sep) or (key in ("report", "doc") and not value):
            sys.exit(f"speed_tables.py: unknown or malformed option {arg!r}; options: --report=PATH --doc=PATH "
                     "--check --print")
        opts[key] = value if sep else True
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = opts["report"] if os.path.isabs(opts["report"]) or os.path.exists(opts["report"]) else \
        os.path.join(root, opts["report"])
    data = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    if opts["print"]:
        if data is None:
            sys.exit(f"speed_tables.py: no report at {opts['report']}")
        for name, fn in TABLES.items():
            print(f"## {name}\n\n{fn(data)}\n")
        return
    doc = opts["doc"] if os.path.isabs(opts["doc"]) or os.path.exists(opts["doc"]) else os.path.join(root, opts["doc"])
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    new, changed = render_doc(text, data, opts["report"])
    if opts["check"]:
        if changed:
            sys.exit(f"speed_tables.py: {doc} differs from {opts['report']} in table(s) {', '.join(changed)}: "
                     f"run python results/speed_tables.py")
        print(f"{doc}: every table matches {opts['report']}")
        return
    with open(doc, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"{doc}: {len(changed)} table(s) rewritten from {opts['report']}"
          + (f": {', '.join(changed)}" if changed else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
