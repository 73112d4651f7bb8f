"""
results/benchkit/reportfile.py: the one way a report's JSON (bench.py --report and --headline) is read,
by the runner that continues it (results/benchkit/report.py), by the headline's plan that takes its
costs from it (results/benchkit/plan.py) and by the renderer that makes tables of it (results/render.py):
its schema and the fields they read, each of its type (one line naming the file and the field),
and no NaN or infinite figure taken as a measurement.

A row holding a NaN or infinite number (a figure json reads without a word) is no measurement:
the renderer refuses the file, naming the field (a table would print "nan ms"); the runner
takes the row as not measured (status not_run, its reason naming the field) and its section as
incomplete, so the next run measures that row again. Anything else not finite (outside the
rows) is refused by both. Standard library only (and cli).
"""

import json

from nanotost import atomic, cli

SCHEMA = "nanotost-bench-report/1"


def is_report(data):
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def _parts(data):
    """(where, section name, part) of every section and of every part in the history."""
    out = [(f"sections.{name}", name, part) for name, part in data["sections"].items()]
    return out + [(f"history[{i}]", part.get("section"), part) for i, part in enumerate(data.get("history", []))]


def part_measured_at(data, name, commit):
    """Section `name` as measured at `commit` (a prefix of its hash): the current section or a
    part of the history; None where the report holds none."""
    return next((part for _, section, part in _parts(data)
                 if section == name and str(part.get("commit", "")).startswith(commit)), None)


def check(data, path, fix, refuse):
    """The report `data` read from `path` checked in place: its fields of their types, and every
    NaN or infinite figure. refuse: such a figure is one line (the renderer); else its row is
    replaced by a row saying it was refused (its section then `incomplete`: measured again).
    Returns [(where, field, value)] of the rows replaced."""
    cli.require(is_report(data), f"{path} is not a report of bench.py (schema {data.get('schema')!r}): {fix}")
    with atomic.reading(path, fix):  # the fields the runner and the tables read, each of its type
        _ = dict(data["meta"]), list(data["runs"]), list(data.get("history", []))
        for _, _, part in _parts(data):
            _ = part.get("status"), [(dict(row), row["status"]) for row in list(part["rows"])]
    replaced = []
    for where, _, part in _parts(data):
        for i, row in enumerate(part["rows"]):
            found = atomic.non_finite(row)
            if not found:
                continue
            field = f"{where}.rows[{i}].{found[0]}"
            if refuse:
                raise cli.UserError(f"{path}: {field} is {json.dumps(found[1])}, not a finite number: {fix}")
            keys = {k: row[k] for k in ("arch", "impl", "backend", "mode", "B", "T") if k in row}
            part["rows"][i] = dict(keys, status="not_run", reason=f"refused on reading: {found[0]} was "
                                                                  f"{json.dumps(found[1])}, not a finite number; "
                                                                  "measured again")
            if part.get("status") in ("ok", "timed_out", "failed", "skipped"):
                part.update(status="incomplete", reason="a row held a figure that is not a finite number: "
                                                        "the next run measures it again")
            replaced.append((field, found[0], found[1]))
    found = atomic.non_finite(data)  # (outside the rows: no measurement to take again)
    if found:
        raise cli.UserError(f"{path}: {found[0]} is {json.dumps(found[1])}, not a finite number: {fix}")
    return replaced


def read_report(path, fix, refuse=False):
    """The report at `path`, checked (check): (data, the rows replaced)."""
    data = atomic.read_json(path, fix)
    return data, check(data, path, fix, refuse)
