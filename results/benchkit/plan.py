"""
results/benchkit/plan.py: the headline's plan, row by row. Every row it measures, in the order it runs
them (results/benchkit/order.py's stages, each section's rows in the section's own order), each with its
estimated cost (results/benchkit/costs.py) from the reports a device wrote before; a row starts only
when its estimate fits in what is left (the same rule the sections' processes apply, fits()).

    python bench.py --headline --plan_from=results/nvidia-h200.json   # the plan, measuring nothing
    python bench.py --headline --plan_from=results/nvidia-h200.json --budget_s=300

The plan prints each row, its estimated seconds and how the estimate was made, whether it fits
in --budget_s (540 s by default, less MARGIN_S for the end of the command), and ends with the
line `fits: N of M target rows`: a row of unknown cost (nothing recorded to estimate it from)
is never counted as fitting, and that line names those rows. A run takes its estimates from the rows it measured itself,
then the report at its --out, then results/<gpu>.json, then (a GPU without its own report) the
newest other GPU's report in results/ (said in its first lines).
"""

import glob
import os

from nanotost import REPO, cli, lists
from results.benchkit.costs import Costs, compile_seconds, kind
from results.benchkit.order import TARGET, in_stage, stages_of
from results.benchkit.part import ROW_KEYS, row_key
from results.benchkit.reportfile import read_report
from results.benchkit.settings import SECTION_START_S, chosen_sections, row_reserve_s, section_limits

MARGIN_S = 25  # of the headline's deadline, kept for the end of the command: the writes, the tables
FIX = "give another report's JSON (results/<gpu>.json), or restore this one (git checkout)"


def fits(estimate, left_s):
    """Whether a row of this estimate (None: nothing known, 0) starts with left_s seconds left."""
    return (estimate or 0.0) <= left_s


def readable_report(path):
    """The report at path (its rows that hold a NaN or infinite figure left out), or None."""
    try:
        return read_report(path, FIX)[0]
    except (cli.UserError, OSError):
        return None


def cost_sources(meta, out):
    """[(label, report)]: the reports a run takes its estimates from after its own rows (which
    hold what the report at `out` held, in its history): results/<gpu>.json, else (a GPU without
    one) the newest report of another GPU in results/."""
    own = os.path.join(REPO, "results", f"{meta['slug']}.json")
    if os.path.isfile(own) and os.path.realpath(own) != os.path.realpath(out):
        data = readable_report(own)
        if data is not None:
            return [(os.path.relpath(own, REPO), data)]
    if not meta.get("gpu"):
        return []
    others = [(p, readable_report(p)) for p in sorted(glob.glob(os.path.join(REPO, "results", "*.json")))]
    others = [(p, d) for p, d in others if d is not None and d["meta"].get("gpu") and d["meta"].get("date")]
    if not others:
        return []
    path, data = max(others, key=lambda pd: pd[1]["meta"]["date"])
    return [(f"{os.path.relpath(path, REPO)} (another GPU: {data['meta'].get('name')})", data)]


def estimates_for(cfg, costs, name, keys):
    """{row_key: estimated seconds or None} of the rows `keys` of section `name`; a main job's
    profile, where it has one, under the key of its row with mode=profile."""
    out = {row_key(k): costs.estimate(name, k)[0] for k in keys}
    if name == "main_job":
        out.update({row_key(dict(k, mode="profile")): costs.estimate(name, dict(k, mode="profile"))[0] for k in keys})
    return out


def planned(cfg, sections, cuda):
    """[(section, stage, key)] of every row of the chosen sections, in the order the headline
    runs them."""
    chosen = chosen_sections(cfg, sections)
    return [(name, stage, key) for name, stage in stages_of(chosen) for key in sections[name].rows(cfg, cuda)
            if in_stage(name, key, stage)]


def simulate(cfg, sections, entries, meta_s):
    """Each planned row with whether it fits: [(section, stage, key, seconds, how, fits, left)],
    spending the budget as a run would (a stage's process start where one of its rows runs; each
    section's own limit, --section_s)."""
    left, reserve = cfg.budget_s - MARGIN_S - meta_s, row_reserve_s(cfg)
    cap = dict(section_limits(cfg, sections))
    started, out = set(), []
    for name, stage, key, seconds, how in entries:
        need = (seconds or 0.0) + (0.0 if (name, stage) in started else SECTION_START_S)
        ok = fits(need + reserve, min(left, cap[name]))
        if ok:
            left, cap[name] = left - need, cap[name] - need
            started.add((name, stage))
        out.append((name, stage, key, seconds, how, ok, left))
    return out


def describe(key):
    return " ".join(f"{k}={key[k]}" for k in ROW_KEYS if k in key) or "-"


def show(cfg, sections):
    """--plan_from: the plan the recorded costs of that report give, printed; nothing measured."""
    data = readable_report(cfg.plan_from)
    cli.require(data is not None, f"plan_from={cfg.plan_from!r} is not a report bench.py can read: {FIX}")
    meta = data["meta"]
    costs = Costs(cfg, [(cfg.plan_from, data)])
    entries = [(name, stage, key, *costs.estimate(name, key)) for name, stage, key in
               planned(cfg, sections, bool(meta.get("gpu")))]
    meta_s = float((data["sections"].get("meta") or {}).get("wall_s") or 0.0) + SECTION_START_S
    rows = simulate(cfg, sections, entries, meta_s)
    print(f"the headline's plan from the costs {cfg.plan_from} records ({meta.get('name')}, torch {meta.get('torch')}, "
          f"commit {str(meta.get('commit'))[:10]}): budget_s={cfg.budget_s:g}, less {MARGIN_S} s kept for the end "
          f"and {meta_s:.0f} s of meta; a stage's process start {SECTION_START_S:g} s; a row starts when its "
          f"estimate and {row_reserve_s(cfg):g} s fit in what is left")
    print(f"  #  {'tier':<6} {'section':<18} {'row':<48} {'est s':>7}  {'fits':<4} {'left s':>6}  how")
    for i, (name, stage, key, seconds, how, ok, left) in enumerate(rows, 1):
        est = f"{seconds:7.1f}" if seconds is not None else "      ?"
        verdict = "?" if seconds is None else "yes" if ok else "NO"
        print(f"{i:>3}  {stage:<6} {name:<18} {describe(key):<48} {est}  {verdict:<4} {left:6.0f}  "
              f"{how if seconds is not None else 'unknown (' + how + '): starts if any time is left'}")
    target = [r for r in rows if r[1] == TARGET]
    priced = [r for r in target if r[3] is not None]  # (a row of unknown cost is never counted as fitting)
    unknown = [f"{r[0]} {describe(r[2])}" for r in target if r[3] is None]
    fit = sum(r[5] for r in priced)
    print(f"fits: {fit} of {len(target)} target rows" + (f"; {len(unknown)} of unknown cost, not counted: "
                                                         f"{lists.few(unknown)}" if unknown else ""))
    return dict(rows=rows, target=len(target), fit=fit, unknown=unknown, target_s=sum(r[3] for r in priced if r[5]))


def compile_record(merged, ran, sources):
    """What this run's compiles took (the rows it measured in the sections `ran`: compile_s,
    first_call_s, a main job's first_iter_s) beside the same rows in the report its estimates
    came from: the figure that says what the compile cache saves."""
    earlier = {}  # (kind, row_key) -> the row, in the first source (the newest of its rows first)
    for _, data in sources[:1]:
        parts = list((data.get("sections") or {}).items())
        for name, part in parts + [(h.get("section"), h) for h in reversed(data.get("history") or [])]:
            for r in part.get("rows", []):
                earlier.setdefault((kind(name), row_key(r)), r)
    mine = dict(seconds=0.0, rows=0)
    before = dict(seconds=0.0, rows=0, source=sources[0][0] if sources else None)
    for name in ran:
        for r in (merged["sections"].get(name) or {}).get("rows", []):
            s = compile_seconds(kind(name), r)
            if s is None or r.get("kept_from"):
                continue
            mine.update(seconds=mine["seconds"] + s, rows=mine["rows"] + 1)
            old = earlier.get((kind(name), row_key(r)))
            if old is not None and compile_seconds(kind(name), old) is not None:
                before.update(seconds=before["seconds"] + compile_seconds(kind(name), old), rows=before["rows"] + 1)
    return dict(mine, seconds=round(mine["seconds"], 1), before=dict(before, seconds=round(before["seconds"], 1)))
