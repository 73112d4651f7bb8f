"""
SPEED.md's tables: the functions that turn the JSON `python bench.py --report` writes
(results/<gpu>.json) into markdown, registered in TABLES for results/render.py, which renders
every table of the documents:

    python results/render.py                 # SPEED.md's tables (and every other document's)
    python results/render.py --check         # exit 1 naming each table that differs from its JSON
    python results/render.py --show=speed_tables --json_path=out-bench/cpu-report.json   # any report

With no report committed at REPORT, its tables say so (AWAITED). Ratios are worded as they
read: "2.0x faster than", "3.3x slower than". Standard library only.
"""

from results.markdown import num, ratio_words, table

REPORT = "results/nvidia-h200.json"  # the committed GPU report SPEED.md shows (an H200's: its own file)
AWAITED = {REPORT: "`python bench.py --report --out=results/` on a GPU (SPEED.md, The GPU report)"}
# the targets (bf16, one H100): the operator's of issue 25, the others of issue 31; None: no target for that row
OP_TARGETS = {(1, 16384): 0.15, (16, 1024): 0.2}  # TSSA fwd+bwd GPU busy ms
TRAIN_TARGETS = {4096: 0.65, 16384: 0.4, 65536: 0.2}  # ToST / faster GPT-2 step time
DECODE_TARGET_MS = 0.3  # ToST per token at every context 1K..64K, and never slower than GPT-2
MAIN_JOB_TARGET = 600e3  # tokens/s on one H100 (>= 40% MFU)
OP_IMPLS = {"triton": "TSSA `triton`", "compiled": "TSSA `torch` compiled", "torch": "TSSA `torch` eager",
            "cpu": "TSSA `cpu`", "sdpa_flash": "SDPA FlashAttention-2", "sdpa_cudnn": "SDPA cuDNN",
            "sdpa": "SDPA (its own choice)"}


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
    """One line per named section of the report that is not ok: what happened to it (a section
    the report does not have, e.g. one of --report's in a headline, is not named)."""
    lines = []
    for name in names:
        if name not in (data.get("sections") or {}):
            continue
        s = section(data, name)
        if s.get("status") != "ok":
            what = {"timed_out": f"timed out at its limit of {s.get('limit_s', 0):.0f} s (the rows it measured "
                                 f"are shown)", "not_run": "has not run", "failed": "failed",
                    "skipped": "was skipped", "running": "was cut short by the end of the command (the rows it "
                                                         "measured are shown)",
                    "partial": "has rows waiting for a later stage of the headline (the rows it measured are shown)",
                    "incomplete": "has rows to measure again (the rows it measured are shown)",
                    "interrupted": "was interrupted (the rows it measured are shown)"}.get(s.get("status"),
                                                                                          s.get("status"))
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


def table_gpu_meta(data):
    """Where and with what the report was measured, and each section's fate."""
    m = data.get("meta", {})
    commit = (m.get("commit") or "unknown")[:12] + (" (with uncommitted changes)" if m.get("dirty") else "")
    rows = [("device", f"{m.get('name')}" + (f", driver {m['driver']}" if m.get("driver") else "")
             + (f", {m['gpu_memory_gib']} GiB, {m['sm_count']} SMs" if m.get("sm_count") else "")),
            ("software", f"torch {m.get('torch')}, CUDA {m.get('cuda')}, Triton {m.get('triton')}, "
                         f"cuDNN {m.get('cudnn')}, Python {m.get('python')}"),
            ("code", f"commit {commit}, source sha256 {m.get('source_sha256')}"
                     + (f" ({m['commit_check']})" if m.get("commit_check") else "")
                     + (f" ({m['commit_note']})" if m.get("commit_note") else "")),
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


# the sections that hold training rows: the headline's train, the report's train_*
TRAIN_SECTIONS = ("train", "train_tost", "train_tost_triton", "train_gpt2_flash", "train_gpt2_cudnn")
# a training row's column: ToST-Base by tssa_impl, GPT-2 Base by SDPA backend
TRAIN_COLUMNS = (("tost", "torch", "ToST-Base `torch`"), ("tost", "auto", "ToST-Base `auto`"),
                 ("tost", "triton", "ToST-Base `triton`"), ("gpt2", "flash", "GPT-2 FlashAttention-2"),
                 ("gpt2", "cudnn", "GPT-2 cuDNN"), ("gpt2", "default", "GPT-2 (SDPA's own choice)"))


def train_rows(data):
    """Every training row of the report, from whichever of TRAIN_SECTIONS it has."""
    return [r for n in TRAIN_SECTIONS for r in section(data, n).get("rows", [])]


def train_column(r):
    """(arch, tssa_impl or SDPA backend) of a training row: its column."""
    return r.get("arch"), (r.get("impl") or "torch") if r.get("arch") == "tost" else r.get("backend")


def table_gpu_train(data):
    """The training step of ToST-Base vs GPT-2 Base, equal tokens per step."""
    found = {}
    for r in train_rows(data):
        found.setdefault(train_column(r), {})[(r["T"], r["B"])] = r
    cols = [(key, label) for *key, label in TRAIN_COLUMNS if tuple(key) in found]
    shapes = sorted({k for rows in found.values() for k in rows})
    notes = Notes()
    body = []
    for T, B in shapes:
        cells, tost, gpt2 = [], None, None  # (ms, label, row) of the fastest of each model
        for key, label in cols:
            r = found[tuple(key)].get((T, B))
            if not (ok(r) or (r and r.get("status") == "eager")):  # eager: its compile failed, said in a note
                cells.append(notes.mark(r) if r else "-")
                continue
            ran = f" ({r['backend_ran']})" if r.get("backend_ran") else ""
            cells.append(f"{num(r['ms'])} ms{ran}" + (f", {notes.mark(r)}" if r["status"] == "eager" else ""))
            if label.startswith("ToST") and (tost is None or r["ms"] < tost[0]):
                tost = (r["ms"], label, r)
            if label.startswith("GPT-2") and (gpt2 is None or r["ms"] < gpt2[0]):
                gpt2 = (r["ms"], label, r)
        ratio = tost[0] / gpt2[0] if tost and gpt2 else None
        vs = f"{ratio:.2f}x the time: {ratio_words(tost[0], gpt2[0], 'GPT-2')}" if ratio else "-"
        goal = judge(data, TRAIN_TARGETS.get(T), ratio, lambda r, t: r <= t, f"<= {TRAIN_TARGETS.get(T)}x")
        peaks = [side[2].get("peak_mb") for side in (tost, gpt2) if side]
        peak = f"{num(peaks[0] / 1024)} / {num(peaks[1] / 1024)}" if len(peaks) == 2 and None not in peaks else "-"
        body.append([f"{T:,} x {B}"] + cells + [vs, goal, peak])
    head = section_line(data, ["train", "train_tost", "train_gpt2_flash", "train_gpt2_cudnn"])
    if not body:
        return head.strip() or "No rows."
    s = next(section(data, n) for n in TRAIN_SECTIONS if section(data, n).get("train_tokens"))
    peak_is = next((r["peak_is"] for rows in found.values() for r in rows.values() if r.get("peak_is")), "-")
    said = sorted({r["auto_said"] for r in train_rows(data) if r.get("auto_said")})
    head += (f"Forward, backward and AdamW of one step of {s['train_tokens']:,} tokens (T x B), "
             f"{'compiled (torch.compile, a fresh compile per row)' if s.get('compiled') else 'eager'}, "
             f"{s.get('dtype') + ' autocast' if s.get('dtype') != 'float32' else 'float32'}; ms per step (the "
             f"attention kernel that ran). Peak GB, ToST / GPT-2, of the two rows compared (the faster of each): "
             f"{peak_is}.\n\n")
    foot = "".join(f"\n\n`auto` said: {line}" for line in said)
    return head + table(["T x B"] + [label for _, label in cols] + ["ToST / faster GPT-2", "target", "peak GB"],
                        body) + notes.text() + foot


DECODE_KINDS = [("tost", "torch", "eager", "ToST `torch` eager"), ("tost", "torch", "captured", "ToST `torch` CUDA graph"),
                ("tost", "torch", "compiled", "ToST `torch` compiled"), ("tost", "triton", "eager", "ToST `triton` eager"),
                ("tost", "triton", "captured", "ToST `triton` CUDA graph"),
                ("tost", "triton", "compiled", "ToST `triton` compiled"), ("gpt2", None, "eager", "GPT-2 eager"),
                ("gpt2", None, "captured", "GPT-2 CUDA graph"), ("gpt2", None, "compiled", "GPT-2 compiled")]


def decode_kind(r):
    """(arch, impl, mode) of a decode row; ToST rows of reports before tssa_impl was a column ran `torch`."""
    return r.get("arch"), r.get("impl") or ("torch" if r.get("arch") == "tost" else None), r.get("mode")


def decode_verdict(data, best):
    """The decoding target: at every context, the fastest ToST row <= DECODE_TARGET_MS and no slower
    than the fastest GPT-2 row. best: {T: (fastest ToST ms, fastest GPT-2 ms or None)}."""
    if not best:
        return ""
    worst = max(ms for ms, _ in best.values())
    slower = [T for T, (ms, gpt2) in best.items() if gpt2 is not None and ms > gpt2]
    verdict = judge(data, DECODE_TARGET_MS, (worst, slower), lambda x, t: x[0] <= t and not x[1], "")
    return (f"\n\nTarget: ToST <= {DECODE_TARGET_MS} ms per token at every context and never slower than GPT-2 "
            f"(the fastest row of each): {num(worst)} ms at most" + (f", slower than GPT-2 at "
            f"{', '.join(f'{T:,}' for T in slower)}" if slower else "") + f"{verdict}.")


def table_gpu_decode(data):
    """Per-token decoding at each context: ToST's constant state vs GPT-2's static KV cache, by
    implementation and by how the step runs (op by op, a CUDA graph, compiled then a graph)."""
    rows = section(data, "decode").get("rows", [])
    if not rows:
        return section_line(data, ["decode"]).strip() or "No rows."
    by_kind = {(decode_kind(r), r["T"]): r for r in rows}
    kinds = [k for k in DECODE_KINDS if any(decode_kind(r) == k[:3] for r in rows)]
    contexts = sorted({r["T"] for r in rows})
    notes = Notes()
    body, per_kind, best = [], {k: [] for k in kinds}, {}
    for T in contexts:
        cells, tost, gpt2 = [], [], []
        for kind in kinds:
            r = by_kind.get((kind[:3], T))
            if not ok(r):
                cells.append(notes.mark(r) if r else "-")
                continue
            per_kind[kind].append(r["ms"])
            (tost if kind[0] == "tost" else gpt2).append(r["ms"])
            cells.append(f"{num(r['ms'])} ({num(r.get('gpu_ms'))}, {num(r.get('kernels'))}); "
                         f"{num(r.get('state_mb'))} MB")
        if tost:
            best[T] = (min(tost), min(gpt2) if gpt2 else None)
        body.append([f"{T:,}"] + cells)
    body.append(["max / min over contexts"] + [f"{max(ms) / min(ms):.2f}x" if len(ms) > 1 else "-"
                                               for ms in per_kind.values()])
    dtype = next((r["dtype"] for r in rows if r.get("dtype")), "?")
    head = section_line(data, ["decode"]) + (f"One token after a context of T tokens, batch 1, weights in {dtype}. "
                                            "Each cell: wall ms per token (GPU busy ms, kernels per token); the "
                                            "state the model carries. CUDA graph: the step op by op, recorded "
                                            "once and replayed; compiled: torch.compile's step, recorded and "
                                            "replayed.\n\n")
    return head + table(["context"] + [k[3] for k in kinds], body) + notes.text() + decode_verdict(data, best)


def profile_cell(profile):
    """A main job row's profile: GPU ms per micro-step, the share of each kind of kernel, the top one."""
    if not profile:
        return "-"
    shares = ", ".join(f"{kind} {100 * share:.0f}%" for kind, share in profile["shares"].items() if share >= 0.005)
    top = profile["top_kernels"][0] if profile.get("top_kernels") else None
    return f"{num(profile['gpu_ms'])} ms: {shares}" + (f"; top `{top[0][:60]}` {num(top[1])} ms" if top else "")


def table_gpu_main_job(data):
    """The main job's throughput: train.py on config/tost_owt.py, and config/gpt2_owt.py beside it."""
    s = section(data, "main_job")
    rows = s.get("rows", [])
    notes = Notes()
    body = []
    for r in rows:
        if not ok(r):
            body.append([r.get("config", "-"), notes.mark(r), "-", "-", "-", "-", "-"])
            continue
        tps, tost = r.get("tokens_per_s"), r.get("arch", "tost") == "tost"  # (reports before GPT-2's row: ToST)
        goal = judge(data, MAIN_JOB_TARGET if tost else None, tps, lambda x, t: x >= t,
                     f">= {MAIN_JOB_TARGET / 1e3:.0f}K")
        impl = f", `{r['impl']}`" if r.get("impl") else ""
        fell = f" ({notes.mark(dict(status='fell back', reason=r['tssa_fallback']))})" if r.get("tssa_fallback") else ""
        body.append([f"`{r['config']}`{impl}, {'compiled' if r.get('compiled') else 'eager'}{fell}",
                     f"{r['iters']} ({r['iters_logged']} logged)", num(r.get("tokens_per_iter")),
                     f"{num(tps)} (median from iter {r['steady_from_iter']})",
                     f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else f"- ({r.get('mfu_note', '')})", goal,
                     profile_cell(r.get("profile"))])
    if not rows:
        return section_line(data, ["main_job"]).strip() or "No rows."
    commands = [r["command"] for r in rows if r.get("command")] or [s.get("command")]  # each row ran its own
    others = " (the other rows: the same with their config and `--tssa_impl`)" if len(set(commands)) > 1 else ""
    head = section_line(data, ["main_job"]) + (f"train.py as `python bench.py --headline --sections=main_job` runs it, "
                                               f"with a data folder of its own: `{commands[0]}` on "
                                               f"{s.get('data')}{others}.\n\n")
    foot = ("\n\nProfile: GPU busy ms of one compiled micro-step (12 x 1,024 tokens, forward and backward) and "
            "the share of each kind of kernel, told by name (results/benchkit/main_job.py's KERNEL_KINDS).") if any(
        r.get("profile") for r in rows) else ""
    return head + table(["job", "iterations", "tokens / iteration", "tokens/s", "MFU", "target", "profile"],
                        body) + notes.text() + foot


def table_gpu_kernels(data):
    """Each Triton launch of one forward and backward (the headline's section kernel_times): its
    GPU time and bandwidth beside kernels.triton_tssa.launch_plan()'s bytes and modelled time."""
    if "kernel_times" not in (data.get("sections") or {}):
        return ("No `kernel_times` section in this report: `python bench.py --headline` measures it (SPEED.md, "
                "The headline).")
    s = section(data, "kernel_times")
    out = section_line(data, ["kernel_times"])
    notes = Notes()
    for r in s.get("rows", []):
        where = f"B={r.get('B')}, T={r.get('T'):,}"
        if not ok(r):
            out += f"{where}: {notes.mark(r)}\n\n"
            continue
        clock = "GPU" if r.get("timer") == "profiler" else "interpreted wall"
        gpu = f"{num(r['gpu_ms'])} ms of {clock} time, {num(r.get('tbps'))} TB/s over all" if r.get("gpu_ms") else \
            "no total (a launch without a time)"
        out += (f"**{where}**: {len(r['launches'])} launches, {num(r['bytes'] / 1e6)} MB read and written, {gpu}; "
                f"the model: {num(r['modelled_ms'])} ms.\n\n")
        body = []
        for launch in r["launches"]:
            what = [str(v) for k, v in launch.items() if isinstance(v, str) and k not in ("kernel", "direction",
                                                                                        "unmatched")]
            body.append([str(launch["launch"]), f"`{launch['kernel']}`" + (f" ({', '.join(what)})" if what else ""),
                         launch.get("direction", "-"),
                         num(launch.get("grid")), num((launch["read"] + launch["write"]) / 1e6),
                         num(launch.get("l2_read", 0) / 1e6) if "l2_read" in launch else "-",
                         num(launch.get("gpu_us")) if launch.get("gpu_us") is not None else
                         f"- ({launch.get('unmatched', 'not seen')})", num(launch.get("tbps")),
                         num(launch["modelled_us"]), f"{num(launch['x_model'])}x" if launch.get("x_model") else "-"])
        out += table(["#", "kernel", "direction", "programs", "MB read + written", "MB read again (L2)",
                      f"{clock} us", "TB/s", "modelled us", "measured / modelled"], body)
        others = r.get("other_kernels") or []
        out += ("\n\nAround the launches, per call: " + "; ".join(f"`{n[:60]}` x{num(c)} {num(ms)} ms"
                                                                for n, c, ms in others[:6]) + ".") if others else ""
        out += "\n\n"
    timer = s.get("timer", "")
    model = next((r.get("model_gpu") for r in s.get("rows", []) if r.get("model_gpu")), None)
    return (out + f"fwd+bwd, causal, {s.get('H')} heads of {s.get('p')}, {s.get('dtype')}; each launch's time is "
            f"the median of {next((r['calls'] for r in s.get('rows', []) if r.get('calls')), '-')} calls ({timer}). "
            "TB/s: the launch's bytes read and written (launch_plan) over its time; modelled: "
            "modelled_time_s(launch" + (f", gpu={model!r}" if model else "") + ")." + notes.text()).strip()


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


def bare_ratio(ours, theirs):
    """ratio_words without the other side's name: "3.7x faster", "2.0x slower", "as fast"."""
    return ratio_words(ours, theirs, "").replace(" than", "").replace(" as ", " ").strip()


def best_row(rows, pick, key="ms"):
    """The fastest ok row among rows for which pick(row) holds (None if none)."""
    found = [r for r in rows if ok(r) and pick(r) and r.get(key) is not None]
    return min(found, key=lambda r: r[key]) if found else None


def summary_op(data):
    """The operator from 16K tokens on: the best TSSA against the faster SDPA, GPU time."""
    op = section(data, "op").get("rows", [])
    said = []
    for T in sorted({r["T"] for r in op if r.get("B") == 1 and r["T"] >= 16384}):
        tssa = best_row(op, lambda r: r["B"] == 1 and r["T"] == T and not r["impl"].startswith("sdpa"), "gpu_ms")
        sdpa = best_row(op, lambda r: r["B"] == 1 and r["T"] == T and r["impl"].startswith("sdpa"), "gpu_ms")
        if tssa and sdpa:
            said.append(f"{bare_ratio(tssa['gpu_ms'], sdpa['gpu_ms'])} at {T // 1024}K "
                        f"({num(tssa['gpu_ms'])} ms, `{tssa['impl']}`)")
    return "- the operator, forward+backward, GPU time against the faster SDPA: " + ", ".join(said) + ";" \
        if said else None


def summary_train(data):
    """The training step at each length both models ran: ToST-Base against the faster GPT-2 Base
    (a ToST row that ran eager because its compile failed counts, marked)."""
    train = train_rows(data)
    said, eager = [], False
    for T in sorted({r["T"] for r in train}):
        tost = best_row(train, lambda r: r["T"] == T and r.get("arch") == "tost") or next(
            (r for r in train if r["T"] == T and r.get("arch") == "tost" and r.get("status") == "eager"), None)
        gpt2 = best_row(train, lambda r: r["T"] == T and r.get("arch") == "gpt2")
        if tost and gpt2:
            eager = eager or tost.get("status") == "eager"
            peak = f", peak {num(tost['peak_mb'] / 1024)} GB against {num(gpt2['peak_mb'] / 1024)}" if tost.get(
                "peak_mb") and gpt2.get("peak_mb") else ""
            said.append(f"{bare_ratio(tost['ms'], gpt2['ms'])} at {T // 1024}K"
                        + ("*" if tost.get("status") == "eager" else "") + f" (`{tost.get('impl') or 'torch'}`{peak})")
    if not said:
        return None
    tokens = next((section(data, n)["train_tokens"] for n in TRAIN_SECTIONS if section(data, n).get("train_tokens")), 0)
    return (f"- a training step of {tokens:,} tokens, the faster ToST-Base "
            f"against the faster GPT-2 Base (its tssa_impl, the peak memory of the same two rows): " + ", ".join(said)
            + (" (*eager: torch.compile failed there, SPEED.md says why)" if eager else "") + ";")


def summary_decode(data):
    """One token as a CUDA graph (the step op by op or compiled: the faster at each context):
    ToST's range over contexts, GPT-2 at its longest context."""
    dec = [r for r in section(data, "decode").get("rows", []) if ok(r) and r.get("mode") in ("captured", "compiled")]
    best = {}
    for r in dec:
        if r["ms"] < best.get((r["arch"], r["T"]), r)["ms"] or (r["arch"], r["T"]) not in best:
            best[(r["arch"], r["T"])] = r
    tost = sorted((r for (arch, _), r in best.items() if arch == "tost"), key=lambda r: r["T"])
    if len(tost) < 2:
        return None
    gpt2 = max((r for (arch, _), r in best.items() if arch == "gpt2"), key=lambda r: r["T"], default=None)
    return (f"- a token decoded as a CUDA graph: ToST-Base {num(min(r['ms'] for r in tost))}-"
            f"{num(max(r['ms'] for r in tost))} ms after {tost[0]['T'] // 1024}K to "
            f"{tost[-1]['T'] // 1024}K tokens from a {num(tost[-1]['state_mb'])} MB state"
            + (f"; GPT-2 Base {num(gpt2['ms'])} ms after {gpt2['T'] // 1024}K, from "
               f"{num(gpt2['state_mb'])} MB of KV cache;" if gpt2 else ";"))


def summary_main_job(data):
    """Every ToST main job measured (one per tssa_impl), GPT-2's beside them."""
    rows = [r for r in section(data, "main_job").get("rows", []) if ok(r)]
    tost = [r for r in rows if r.get("arch", "tost") == "tost"]
    if not tost:
        return None

    def told(r):
        impl = f"`{r['impl']}`, " if r.get("impl") else ""
        mfu = f"{r['mfu']:.0%} MFU" if r.get("mfu") is not None else "MFU not known"
        return f"{num(r['tokens_per_s'])} tokens/s ({impl}{mfu})"
    gpt2 = next((r for r in rows if r.get("arch") == "gpt2"), None)
    beside = f"; GPT-2 Base's (`{gpt2['config']}`): {told(gpt2)}" if gpt2 else ""
    return (f"- the main job (`{tost[0]['config']}`, one GPU's share): "
            f"{', '.join(told(r) for r in tost)}{beside}.")


def table_gpu_summary(data):
    """README.md's GPU lines, each from the report's rows: the operator, the training step,
    decoding, the main job."""
    m = data.get("meta", {})
    if not m.get("gpu"):
        return "_No GPU report is committed yet._"
    lines = []
    for line, names in ((summary_op(data), ("op",)), (summary_train(data), ("train", "train_tost", "train_gpt2_flash")),
                        (summary_decode(data), ("decode",)), (summary_main_job(data), ("main_job",))):
        if line:  # a section kept from an earlier run (another commit) says which
            older = sorted({str(section(data, n).get("commit"))[:7] for n in names if section(data, n).get("commit")
                            and section(data, n).get("commit") != m.get("commit")})
            lines.append(line[:-1] + f" (measured at commit {', '.join(older)})" + line[-1] if older else line)
    return "\n".join(lines or ["- (no row of the report has both sides)"]) + (
        f"\n\nOne {m.get('name')}, bf16, torch {m.get('torch')}, the code of commit {str(m.get('commit'))[:7]}, "
        f"`{REPORT}` (SPEED.md, On a GPU: the tables).")


TABLES = {name: (REPORT, fn) for name, fn in (
    ("gpu_meta", table_gpu_meta), ("gpu_op", table_gpu_op), ("gpu_train", table_gpu_train),
    ("gpu_decode", table_gpu_decode), ("gpu_main_job", table_gpu_main_job), ("gpu_check", table_gpu_check),
    ("gpu_kernels", table_gpu_kernels),
    ("gpu_summary", table_gpu_summary))}
FIELDS = {REPORT: ("a report of python bench.py --report", ("schema", "meta", "sections"))}  # for results/render.py
