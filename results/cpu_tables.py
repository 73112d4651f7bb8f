"""
SPEED.md's CPU tables: the JSON `python bench.py` writes without --report or --headline (its
suites, on one thread: results/cpu_bench.json) as markdown, registered in TABLES for
results/render.py. The GPU report's tables are speed_tables.py's. Standard library only.

    python results/render.py --show='cpu_*'    # these tables, to stdout
"""

from results.markdown import num, ratio_words, table


CPU_BENCH = "results/cpu_bench.json"
CPU_KEYS = ("device", "threads", "suites", "impls", "modes", "T", "decode_T", "repeats", "max_case_s", "out")


def cpu_command(data):
    """The bench.py command that wrote the JSON, from the settings it recorded."""
    c = data["meta"]["config"]
    return "python bench.py " + " ".join(f"--{k}={c[k]:g}" if isinstance(c[k], float) else f"--{k}={c[k]}"
                                         for k in CPU_KEYS)


def cpu_cell(r):
    """Process CPU ms (median); wall ms: median, fastest-slowest repeat; or what happened instead."""
    if r is None:
        return "-"
    if r.get("ms") is None:
        return r.get("note") or "not run"
    return f"{num(r['cpu_ms'])} ({num(r['ms'])}; {num(min(r['ms_all']))}-{num(max(r['ms_all']))})"


def cpu_ratio(a, b, name):
    """a vs b in process CPU time, worded as it reads; '-' where either is missing."""
    if not (a and b and a.get("cpu_ms") and b.get("cpu_ms")):
        return "-"
    return ratio_words(a["cpu_ms"], b["cpu_ms"], name)


def cpu_rows(data, suite):
    """(impl, T) -> row, for one suite."""
    return {(r["impl"], r["T"]): r for r in data["results"] if r["suite"] == suite}


def cpu_footer(data):
    m = data["meta"]
    load = ", ".join(f"{x:.1f}" for x in m["load_average"])
    return (f"{m['device']}, {m['dtype']}, torch {m['torch']}; load average {load} (1, 5, 15 minutes) when the run "
            f"ended, on a machine shared with other jobs. Written by `{cpu_command(data)}`.")


CPU_CELLS = ("Each cell: process CPU ms (median), then wall ms: median; fastest-slowest of {n} repeats. The "
             "ratios compare CPU time, which other jobs on a shared machine stretch less than wall time.")


def table_cpu_op(data):
    """The operator fwd+bwd on the CPU: the reference, the C kernels and SDPA, side by side."""
    rows = cpu_rows(data, "op")
    body = []
    for T in sorted({t for _, t in rows}):
        torch_, cpu, sdpa = (rows.get((i, T)) for i in ("torch", "cpu", "sdpa"))
        body.append([f"{T:,}", cpu_cell(torch_), cpu_cell(cpu), cpu_cell(sdpa), cpu_ratio(cpu, torch_, "`torch`"),
                     cpu_ratio(cpu, sdpa, "SDPA"), cpu_ratio(torch_, sdpa, "SDPA")])
    c = data["meta"]["config"]
    head = (f"Forward+backward, causal, B={c['B']}, {c['H']} heads of {c['p']}, per call. "
            + CPU_CELLS.format(n=c["repeats"]) + "\n\n")
    return head + table(["T", "TSSA `torch`", "TSSA `cpu` (C kernels)", "SDPA", "`cpu` vs `torch`", "`cpu` vs SDPA",
                         "`torch` vs SDPA"], body) + "\n\n" + cpu_footer(data)


def state_mb(row):
    """The state a decoding row carried, as bench.py notes it ("state 0.071 MB")."""
    if not row or "state " not in row.get("note", ""):
        return "-"
    return num(float(row["note"].split("state ")[1].split(" MB")[0]))


def table_cpu_decode(data):
    """Whole-model decoding per token on the CPU: ToST-Base's state against GPT-2 Base's KV cache."""
    rows = cpu_rows(data, "model_decode")
    body = []
    for T in sorted({t for _, t in rows}):
        tost, cpu, gpt2 = (rows.get((i, T)) for i in ("torch", "cpu", "sdpa"))
        best = min((r for r in (tost, cpu) if r and r.get("cpu_ms")), key=lambda r: r["cpu_ms"], default=None)
        vs = cpu_ratio(best, gpt2, "GPT-2") + (f" (`{best['impl']}`)" if best and gpt2 and gpt2.get("cpu_ms") else "")
        body.append([f"{T:,}", cpu_cell(tost), cpu_cell(cpu), cpu_cell(gpt2), f"{state_mb(tost)} / {state_mb(gpt2)}",
                     vs])
    c = data["meta"]["config"]
    head = (f"One token after a context of T tokens (synthetic state), batch {c['B']}, per token (each repeat times "
            f"{c['decode_steps']} tokens). " + CPU_CELLS.format(n=c["repeats"]) + "\n\n")
    return head + table(["context", "ToST-Base `torch`", "ToST-Base `cpu`", "GPT-2 Base, KV cache",
                         "state MB, ToST / GPT-2", "faster ToST vs GPT-2"], body) + "\n\n" + cpu_footer(data)


def table_cpu_summary(data):
    """README.md's two lines: the longest operator and decoding contexts of the CPU run."""
    op, dec = cpu_rows(data, "op"), cpu_rows(data, "model_decode")
    lines = []
    T = max((t for i, t in op if i == "sdpa"), default=None)
    if T and all(op.get((i, T), {}).get("cpu_ms") for i in ("torch", "cpu", "sdpa")):
        lines.append(f"- the operator, forward+backward at {T:,} tokens: the C kernels (`cpu`) "
                     f"{cpu_ratio(op[('cpu', T)], op[('torch', T)], 'the reference')}, and "
                     f"{cpu_ratio(op[('cpu', T)], op[('sdpa', T)], 'SDPA')}; the reference "
                     f"{cpu_ratio(op[('torch', T)], op[('sdpa', T)], 'SDPA')};")
    T = max((t for i, t in dec if i == "sdpa"), default=None)
    if T and all(dec.get((i, T), {}).get("cpu_ms") for i in ("torch", "sdpa")):
        r, g = dec[("torch", T)], dec[("sdpa", T)]
        lines.append(f"- decoding ToST-Base after {T:,} tokens (the reference, the default): "
                     f"{r['cpu_ms'] / g['cpu_ms']:.2f}x GPT-2 Base's time per token, from a state of {state_mb(r)} MB "
                     f"against {state_mb(g)} MB of KV cache.")
    m = data["meta"]
    return "\n".join(lines or ["- (no row of the CPU run has both sides)"]) + (
        f"\n\nProcess CPU time on one thread, `{CPU_BENCH}`, load average {m['load_average'][0]:.1f} at the end "
        "of the run (SPEED.md, On the CPU).")


TABLES = {"cpu_op": (CPU_BENCH, table_cpu_op), "cpu_decode": (CPU_BENCH, table_cpu_decode),
          "cpu_summary": (CPU_BENCH, table_cpu_summary)}
FIELDS = {CPU_BENCH: ("the JSON of python bench.py (the suites)", ("meta", "results"))}  # for results/render.py
