"""
results/benchkit/settings.py: bench.py's settings checked before any work (check_settings: a refusal
measures and writes nothing; settings under which a section would record nothing, such as a main
job all warm-up, are refused too: check_measurable), the lists they hold, and the shapes shared
by its modes: the quick run's tiniest shapes (QUICK) and models (TINY), the presets, the
training shape.
"""

import os

import kernels
from nanotost import cli, lists

SUITES = ("op", "decode", "model", "model_decode", "vit")
IMPLS = tuple(i for i in kernels.IMPLS if i != "auto") + ("sdpa", "compiled")  # (--impls=auto: the default set)
MODES = ("fwd", "fwdbwd")
SECTION_START_S = 1.0  # a section's process, forked, starts and writes its part file within it
MIN_BUDGET_S = 90  # budget_s: a section starts only with 60 s of it left, 10 s kept for the writes, ~20 s of meta
# (the headline: ~20 s of meta and 25 s for the writes leave a row 45 s)
TRAINING_SHAPE = (16, 1024)  # (B, T) of the operator at the main job's micro-batch (ToST-Base: 16 x 1K)
QUICK = dict(T="64,128", model_T="64", decode_T="32,64", H=2, p=16, repeats=3, warmup=0, decode_steps=4,
             train_tokens=128, main_iters=3)  # a smoke run of every code path, seconds on a CPU
TINY = dict(n_layer=1, n_head=2, n_embd=32)  # the models of a quick report
PRESETS = {"tost": "tost-base", "gpt2": "gpt2"}


def lengths(key, text):
    """A comma-separated list of positive integers ("4096", "1024,4096"), each once (cli.parse_list)."""
    values = cli.parse_list(key, text, int, what="positive integers")
    below = [str(v) for v in values if v < 1]
    cli.require(not below, f"{key} must be positive integers separated by commas: {lists.few(below)} is not")
    return values


def names(key, text, allowed):
    """A comma-separated list of names, each once and one of `allowed`, as a list (cli.parse_list)."""
    return cli.parse_list(key, text, allowed=allowed)


def chosen_sections(cfg, sections):
    """The sections --sections names (each once: check_settings), or all of `sections`."""
    return list(sections) if cfg.sections == "all" else cli.parse_list("sections", cfg.sections)


def plan_lengths(text, fallback):
    """The lengths of a setting check_settings accepted ("auto": fallback)."""
    return fallback if text == "auto" else cli.parse_list("lengths", text, int)


def quick_defaults(cfg, given):
    """A quick report: the tiniest shapes and models (TINY), every code path in seconds."""
    if cfg.quick:
        for key, value in QUICK.items():
            if key not in given:
                setattr(cfg, key, value)


def main_warmup(cfg):
    """The main job's first iterations, which its tokens/s leaves out (compile, warm-up): the
    first of a quick run's (its iteration 0), else a quarter of them, at most 20."""
    return 1 if cfg.quick else min(20, cfg.main_iters // 4)


def row_reserve_s(cfg):
    """Seconds of a section's limit kept for its last write, beyond a row's estimated cost: a row
    starts only with its estimate and this left (a quick run's rows take milliseconds)."""
    return 0.0 if cfg.quick else 3.0 if cfg.headline else 15.0


def check_measurable(cfg, sections):
    """Refuse settings under which a section would run and record nothing (sections: the
    report's or the headline's): a main job all warm-up, a section's limit all reserve."""
    chosen = chosen_sections(cfg, sections)
    if "main_job" in chosen:
        skip = main_warmup(cfg)
        cli.require(cfg.main_iters > skip, f"main_iters={cfg.main_iters} leaves the main job no iteration to measure: "
                                         f"its tokens/s leaves out the first {skip} (compile and warm-up"
                                         f"{', in a quick run' if cfg.quick else ''}): give --main_iters={skip + 1} "
                                         "or more")
    cli.require([n for n in chosen if n != "meta"], f"sections={cfg.sections!r} measures nothing (meta runs first in "
                                                    "every command): name a section to measure, e.g. --sections=op")
    if cfg.headline:  # the headline measures under a deadline: one that leaves nothing to measure is refused
        cli.require(cfg.budget_s >= MIN_BUDGET_S, f"budget_s={cfg.budget_s:g} leaves the headline no time to measure a "
                                                f"row (it runs under a deadline, and keeps ~20 s for meta and 25 s "
                                                f"for the writes): give --budget_s={MIN_BUDGET_S} or more (540 is "
                                                "its default)")
    if not cfg.section_s.strip():
        return
    reserve = row_reserve_s(cfg)
    least = SECTION_START_S + reserve
    kept = f" and keeps {reserve:g} s of its limit for its last write" if reserve else ""
    limits = section_limits(cfg, sections)
    for name in [n for n in chosen if n != "meta"]:  # (meta measures no rows)
        cli.require(limits[name] > least, f"section_s gives {name} {limits[name]:g} s, too short to measure a row: a "
                                          f"section takes about {SECTION_START_S:g} s to start{kept}; give it more "
                                          f"than {least:g} s")


# The settings each mode reads, by the code that reads them (tests/test_bench_settings.py holds each
# list to it): a setting given must do something, so one the chosen mode does not read is one line
SHARED = ("device", "dtype", "T", "model_T", "decode_T", "B", "H", "p", "threads", "repeats", "warmup", "decode_steps",
          "quick", "out")  # every measuring mode's
MEASURED = ("sections", "section_s", "budget_s", "remeasure", "train_tokens", "main_iters", "main_tssa_impl",
            "compile_cache")  # the report's and the headline's
READS = {
    "suites": SHARED + ("suites", "impls", "modes", "causal", "max_case_s"),
    "report": SHARED + MEASURED,
    "headline": SHARED + MEASURED,
    "plan": ("plan_from", "budget_s", "sections", "section_s", "quick", "B", "T", "model_T", "decode_T", "repeats",
             "warmup", "decode_steps", "train_tokens", "main_iters", "main_tssa_impl"),  # (it measures, writes nothing)
}
SWITCHES = ("report", "headline")  # which mode (check_settings refuses the two together)
WHO = {("suites",): "the suites (bench.py without --report or --headline)", ("report", "headline"): "--report and "
       "--headline", ("suites", "report", "headline"): "a command that measures", ("plan",): "the headline's plan "
       "(--headline --plan_from=<report>)"}  # the modes that read a setting, in words
INSTEAD = {"suites": "drop it, or add --report or --headline", "report": "drop it", "headline": "drop it",
           "plan": "drop it (the plan measures and writes nothing), or drop --plan_from to measure"}


def mode_of(cfg):
    """The mode the settings choose: "plan" (--headline --plan_from), "headline", "report" or "suites"."""
    if cfg.headline:
        return "plan" if cfg.plan_from else "headline"
    return "report" if cfg.report else "suites"


def check_mode_settings(cfg, given):
    """Refuse, in one line, the settings given that the chosen mode never reads (READS)."""
    mode = mode_of(cfg)
    ignored = [k for k in given if k not in READS[mode] + SWITCHES]
    if ignored:
        readers = tuple(m for m in READS if ignored[0] in READS[m] and m != "plan") or ("plan",)
        instead = "drop it, or add --headline" if readers == ("plan",) else INSTEAD[mode]
        cli.unread(given, ignored, f"a setting of {WHO.get(readers, 'another mode')}, which this command does not "
                                   f"run: {instead}")


def check_settings(cfg, sections=None, given=()):
    """Every setting, checked before any work (a refusal measures and writes nothing); sections:
    the report's or the headline's ({name: Section}), which --sections and --section_s name;
    given: the settings the command line or a config file set (check_mode_settings).
    Returns the lists the comma-separated settings hold (None where "auto")."""
    check_mode_settings(cfg, given)
    cli.check(cfg, at_least_1=("B", "H", "p", "repeats", "decode_steps", "train_tokens", "main_iters"),
              non_negative=("warmup", "budget_s"), workers=("threads",), positive=("max_case_s",),
              choices={"main_tssa_impl": kernels.IMPLS})
    cli.require(not (cfg.report and cfg.headline), "report and headline are two modes: give --report or --headline")
    cli.require(cfg.budget_s == 0 or cfg.budget_s >= MIN_BUDGET_S,
                f"budget_s={cfg.budget_s:g} is too short to start any section (each needs 60 s of it, and 10 s are "
                f"kept for writing): give at least {MIN_BUDGET_S}" + ("" if cfg.headline else ", or 0 for no limit"))
    plan = dict(T=lengths("T", cfg.T), suites=names("suites", cfg.suites, SUITES),
                modes=names("modes", cfg.modes, MODES),
                impls=None if cfg.impls == "auto" else names("impls", cfg.impls, IMPLS),
                model_T=None if cfg.model_T == "auto" else lengths("model_T", cfg.model_T),
                decode_T=None if cfg.decode_T == "auto" else lengths("decode_T", cfg.decode_T))
    cli.require(cfg.out, "out must name the results file, e.g. --out=bench_results.json")
    if cfg.sections != "all":  # (the lists' rule in every mode, the names where the mode has sections)
        names("sections", cfg.sections, None if sections is None else tuple(sections))
    section_seconds(cfg, sections)
    cli.require(not cfg.plan_from or cfg.headline, "plan_from prints the headline's plan: give it with --headline")
    cli.require(not cfg.plan_from or os.path.isfile(cfg.plan_from), f"plan_from={cfg.plan_from!r}: no such file; give "
                                                                "a report's JSON, e.g. results/nvidia-h200.json")
    cli.require(cfg.compile_cache in ("auto", "off") or not os.path.isdir(cfg.compile_cache),
                f"compile_cache={cfg.compile_cache!r} is a folder: give 'auto', 'off' or a file, e.g. "
                f"{os.path.join(cfg.compile_cache, 'gpu.compile-cache.zip')}")
    if sections is not None:
        check_measurable(cfg, sections)
    report = cfg.report or cfg.headline
    into_folder = cfg.out == "auto" or (report and cfg.out.endswith(("/", os.sep)))  # a report: <gpu>.json in it
    if os.path.isdir(cfg.out) and not into_folder:
        raise cli.UserError(f"out={cfg.out!r} is a folder: name a file, e.g. "
                            f"--out={os.path.join(cfg.out, 'bench.json')}")
    if cfg.out == "auto":  # where the default goes, checked before anything is measured
        cli.writable_place("out-bench/" if report else "bench_results.json", "--out")
    else:
        cli.writable_place(cfg.out, "--out")
    return plan


def section_limits(cfg, sections):
    """Each section's time limit in seconds: its own (sections: {name: Section}), or section_s
    ("300" for all, "op:200,decode:100" for some)."""
    limits = {n: float(s.limit_s) for n, s in sections.items()}
    for key, seconds in sorted(section_seconds(cfg, sections), key=lambda pair: pair[0] is not None):
        for n in ([key] if key else limits):  # (a section's own over the one for all)
            limits[n] = seconds
    return limits


def section_seconds(cfg, sections=None):
    """section_s as [(section or None for all, seconds)], each section once (cli.parse_list) and
    one of `sections` where given."""
    if not cfg.section_s.strip():
        return []
    pairs = cli.parse_list("section_s", cfg.section_s, float, allowed=None if sections is None else tuple(sections),
                           pairs=True, what="seconds ('300') or section:seconds pairs ('op:200,decode:100')")
    cli.require(all(0 < seconds < 10 ** 7 for _, seconds in pairs), f"section_s must be seconds ('300') or "
                f"section:seconds pairs ('op:200,decode:100'), each in (0, 10**7), got "
                f"{lists.shown(cfg.section_s, lists.split_items(cfg.section_s))}")
    return pairs
