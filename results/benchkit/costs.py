"""
results/benchkit/costs.py: what a row of a report costs in seconds, from the rows a device measured
before (a report's sections and history, read by results/benchkit/reportfile.py), so that each row
starts when its own cost fits in what is left (results/benchkit/part.py) and the headline's plan can be
printed without measuring (results/benchkit/plan.py).

A row measured by this code records its whole cost (row_s). An older row records its parts: the
first call (first_call_s: compiles included), a training row's compile (compile_s), and the ms
per call its measuring calls repeat (timing.measure_row: warm-up, one call, `repeats` repeats of
calls_per_repeat(ms) calls, the profiled calls, one for memory); what else its section spent
(building models, a process's CUDA context) is spread over the rows it measured (setup). A main
job costs its train.py run (wall_s), scaled to the iterations planned.

A row never measured is estimated from the most similar row that was, and says how: another
shape of the same implementation (TSSA's time linear in the tokens, SDPA's in tokens x T), the
same training or decoding row at another length (ToST's step as long at equal tokens; GPT-2's at
most linear in T), another implementation at the same length, ToST's main job for GPT-2's.
Standard library only.
"""

import math

PROFILE_S = 1.0  # torch.profiler's start and stop around a row's profiled calls
REPEAT_MS = 20.0  # a measuring repeat is calls_per_repeat calls lasting about this long (timing.measure_ms)
MAIN_PROFILE_S = 45.0  # a main job's profile (a compile of its model, then 5 micro-steps) until one is timed
KIND = {"train_tost": "train", "train_tost_triton": "train", "train_gpt2_flash": "train",
        "train_gpt2_cudnn": "train"}  # the report's sections holding rows of the headline's `train`
# the implementations whose rows stand in for one never measured, best first (auto: its pick
# compiles and times the reference in a child as well, so its rows over-estimate the others')
IMPL_ORDER = ("triton", "torch", None, "cudnn", "flash", "default", "compiled", "auto")
STAND_IN = {"triton_retiled": "triton",  # an implementation (or a decoding mode) never measured: whose rows
            "autotuned": "compiled"}  # estimate its own (autotuned: an under-estimate, its compile times its kernels)


def calls_per_repeat(ms):
    """How many back-to-back calls one measuring repeat makes, for calls of `ms` each."""
    return max(1, min(200, int(REPEAT_MS / max(ms, 1e-3))))


def kind(section):
    """The kind of rows a section holds (the report's train_* hold the headline's train rows)."""
    return KIND.get(section, section)


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def measuring(kind_, row, cfg):
    """(first_s, s per call, calls) of a measured row of an op, decode or train section at the
    settings C, or None where it lacks its figures."""
    ms, first = row.get("ms"), row.get("first_call_s")
    if not (number(ms) and number(first)):
        return None
    per = ms / 1e3 * (cfg.decode_steps if kind_ == "decode" else 1)  # (a decode row's ms is per token)
    if kind_ == "train" and number(row.get("compile_s")):
        first += row["compile_s"]
    profiled = 3 if kind_ == "op" else 1
    return first, per, cfg.warmup + 1 + cfg.repeats * calls_per_repeat(per * 1e3) + profiled + 1


def job_s(row, cfg):
    """A main job's train.py seconds at C.main_iters iterations (its wall_s less or plus the
    steady iterations it ran more or fewer), or None."""
    wall = row.get("wall_s")
    if not number(wall):
        return None
    iters, tps, per_iter = row.get("iters"), row.get("tokens_per_s"), row.get("tokens_per_iter")
    if number(iters) and number(tps) and number(per_iter) and tps > 0:
        wall += (cfg.main_iters - iters) * per_iter / tps
    return max(wall, 1.0)


class Found:
    """A measured row of a report: the row, its section's kind and name, the report's label,
    and the setup seconds per row its part spent beyond its rows' measuring."""

    def __init__(self, row, kind_, section, label, setup):
        self.row, self.kind, self.section, self.label, self.setup = row, kind_, section, label, setup


def part_setup(kind_, part, cfg):
    """Seconds per row a part spent beyond what its rows' figures account for (building models,
    its process's start): its wall_s less their measuring, over the rows it measured."""
    mine = [r for r in part.get("rows", []) if not r.get("kept_from") and r.get("status") not in ("not_run",
                                                                                                  "skipped")]
    wall = part.get("wall_s")
    if not number(wall) or not mine:
        return 0.0
    if kind_ == "kernel_times":  # (its rows record no first call: the part's time is theirs)
        return wall / len(mine)
    spent = 0.0
    for r in mine:
        got = measuring(kind_, r, cfg) if kind_ in ("op", "decode", "train") else None
        if number(r.get("row_s")):
            spent += r["row_s"]
        elif got:
            spent += got[0] + got[1] * got[2] + PROFILE_S
    return max(0.0, (wall - spent) / len(mine))


def row_setup(kind_, row, cfg, part_s):
    """A row's setup seconds: what its recorded cost (row_s) holds beyond its first call and its
    measuring calls; part_s (its part's, part_setup) for a row that records no cost."""
    if not number(row.get("row_s")):
        return part_s
    got = measuring(kind_, row, cfg) if kind_ in ("op", "decode", "train") else None
    return max(0.0, row["row_s"] - (got[0] + got[1] * got[2] + PROFILE_S)) if got else row["row_s"]


class Costs:
    """The rows of some reports, most trusted first (sources: [(label, report)]), and estimate(),
    the cost of a row planned at the settings C."""

    def __init__(self, cfg, sources):
        self.cfg, self.found, self.parts = cfg, {}, {}
        for label, data in sources:
            parts = list((data.get("sections") or {}).items())
            parts += [(h.get("section"), h) for h in reversed(data.get("history") or [])]
            for name, part in parts:
                k = kind(name)
                if k == "gpu_check_accuracy" and part.get("status") == "ok" and number(part.get("wall_s")):
                    self.parts.setdefault(k, (part["wall_s"], label))
                setup = part_setup(k, part, cfg)
                for r in part.get("rows", []):
                    if r.get("status") not in ("not_run", "skipped", "running"):
                        self.found.setdefault(k, []).append(Found(r, k, name, label, row_setup(k, r, cfg, setup)))

    def estimate(self, section, key):
        """(seconds, how) of the row `key` of `section`; (None, why) where nothing measured
        resembles it."""
        k = kind(section)
        if k == "gpu_check_accuracy":
            got = self.parts.get(k)
            return (got[0], f"its section's time in {got[1]}") if got else (None, "never measured here")
        if k == "main_job":
            return self.main_job(key)
        same = [f for f in self.found.get(k, []) if all(f.row.get(x) == key.get(x) for x in ("arch", "impl", "backend",
                                                                                            "mode", "B", "T"))]
        if same:
            f = same[0]
            if number(f.row.get("row_s")):
                return f.row["row_s"], f"measured: {f.row['row_s']:.1f} s ({f.label})"
            return self.from_row(f, 1.0, f"measured ({f.label})")
        return self.similar(k, key)

    def from_row(self, f, factor, how):
        """The cost of a row like f's measured one, its calls `factor` times as long."""
        if f.kind == "kernel_times":
            return f.setup, f"{how}: its section's time per row"
        got = measuring(f.kind, f.row, self.cfg)
        if got is None:
            return None, "its figures are missing"
        first, per, _ = got
        per *= factor
        calls = self.cfg.warmup + 1 + self.cfg.repeats * calls_per_repeat(per * 1e3) + (3 if f.kind == "op" else 1) + 1
        seconds = f.setup + first + per * calls + PROFILE_S
        return seconds, f"{how}: first call {first:.1f} s, {calls} calls x {per * 1e3:.3g} ms, setup {f.setup:.1f} s"

    def similar(self, k, key):
        """The nearest measured row of the same kind, and how its cost is carried over."""
        rows = self.found.get(k, [])
        T, B = key.get("T") or 1, key.get("B") or 1
        per_token = k in ("op", "kernel_times")  # (the operator's cost follows its tokens; a step's, its length)

        def distance(f):
            mine = (f.row.get("T") or 1) * ((f.row.get("B") or 1) if per_token else 1)
            return abs(math.log(mine / (T * (B if per_token else 1))))
        if per_token:
            impl = key.get("impl")
            near = sorted((f for f in rows if f.row.get("impl") == impl), key=distance)
            if not near and impl in STAND_IN:  # (as long as the kernels it is to replace: an estimate)
                near = sorted((f for f in rows if f.row.get("impl") == STAND_IN[impl]), key=distance)
            if not near:
                return None, "no row of this implementation measured"
            f = near[0]
            r = f.row
            sdpa = str(key.get("impl")).startswith("sdpa")
            factor = (B * T * (T if sdpa else 1)) / (r["B"] * r["T"] * (r["T"] if sdpa else 1))
            law = "tokens x T (SDPA)" if sdpa else "tokens (TSSA)"
            stood = f" of {r['impl']}, never measured itself" if r.get("impl") != key.get("impl") else ""
            return self.from_row(f, factor, f"from B={r['B']} T={r['T']}'s row{stood}, its calls x{factor:.3g} ({law})")
        arch = key.get("arch")
        which = lambda r: r.get("impl") if r.get("arch") == "tost" else r.get("backend")  # noqa: E731
        mode = key.get("mode")
        if k == "decode" and not any(f.row.get("mode") == mode for f in rows) and mode in STAND_IN:
            mode = STAND_IN[mode]  # (a mode never measured: the nearest measured one's rows)
        same_arch = [f for f in rows if f.row.get("arch") == arch and (k != "decode" or f.row.get("mode") == mode)]
        alike = sorted((f for f in same_arch if which(f.row) == which(key)), key=distance)
        if alike:
            f = alike[0]
            factor = 1.0 if arch == "tost" else max(1.0, T / f.row["T"])
            law = "ToST: as long at any T" + (" (equal tokens)" if k == "train" else "") if arch == "tost" else \
                "GPT-2: at most linear in T"
            stood = f" of mode {mode}, never measured itself" if mode != key.get("mode") else ""
            return self.from_row(f, factor, f"from T={f.row['T']}'s row{stood} ({law}), x{factor:.3g}")
        others = sorted((f for f in same_arch if f.row.get("T") == T), key=lambda f: IMPL_ORDER.index(which(f.row))
                        if which(f.row) in IMPL_ORDER else len(IMPL_ORDER))
        if others:
            f = others[0]
            return self.from_row(f, 1.0, f"from {which(f.row)}'s row at the same T")
        return None, "no row of this model measured at this length"

    def main_job(self, key):
        """A main job: its own row (the same model, tssa_impl and mode), else ToST's with another
        tssa_impl or mode (auto's last: its pick adds a compile), else ToST's for GPT-2's.
        mode=profile: the job's profile."""
        rows = self.found.get("main_job", [])
        arch, impl, mode = key.get("arch"), key.get("impl"), key.get("mode")
        if key.get("mode") == "profile":
            timed = [f for f in rows if number(f.row.get("profile_s"))]
            return (timed[0].row["profile_s"], f"a profile timed in {timed[0].label}") if timed else \
                (MAIN_PROFILE_S, "no profile timed yet: assumed")
        order = lambda f: (f.row.get("arch", "tost") != arch, f.row.get("impl") != impl,  # noqa: E731
                           f.row.get("mode") != mode,
                           IMPL_ORDER.index(f.row.get("impl")) if f.row.get("impl") in IMPL_ORDER else 0)
        for f in sorted(rows, key=order):
            s = job_s(f.row, self.cfg)
            if s is None:
                continue
            if (f.row.get("arch", "tost"), f.row.get("impl"), f.row.get("mode")) == (arch, impl, mode):
                return s, f"measured: train.py {f.row['wall_s']:.0f} s at {f.row.get('iters')} iterations ({f.label})"
            what = " ".join(str(x) for x in (f.row.get("arch", "tost"), f.row.get("impl"), f.row.get("mode")) if x)
            return s, f"from the main job {what} (train.py {f.row['wall_s']:.0f} s at {f.row.get('iters')} " \
                      f"iterations, {f.label})" + (": auto's pick adds a compile, an over-estimate"
                                                   if f.row.get("impl") == "auto" else "")
        return None, "no main job measured"


def compile_seconds(kind_, row):
    """The seconds of a measured row that a compile cache can cut (its compile or first call,
    a main job's first iteration), or None."""
    if kind_ == "train":
        return row.get("compile_s") if number(row.get("compile_s")) else None
    if kind_ == "main_job":
        return row.get("first_iter_s") if number(row.get("first_iter_s")) else None
    if kind_ in ("op", "decode"):
        return row.get("first_call_s") if number(row.get("first_call_s")) else None
    return None
