"""
Every table of the project's documents, and every figure registered, rendered from committed JSON. README.md, SPEED.md,
results/recall/README.md and lra/README.md hold each table between `<!-- table: NAME -->` and
`<!-- /table -->`; this script rewrites what lies between from the JSON the table is
registered with, so a figure in a table is the figure in its JSON.

    python results/render.py             # rewrite every table of the documents from its JSON
    python results/render.py --check     # exit 1 naming each table or figure that differs from its JSON
    python results/render.py --show='gpu_*' --json_path=out-bench/cpu-report.json   # some tables, to stdout

The tables are registered by the modules beside this script (MODULES), each with
TABLES = {NAME: (json path relative to the repository, fn(data) -> markdown)}. A module may
also have AWAITED = {json path: the command that writes it} for a JSON that no machine here
could write yet (SPEED.md's GPU report): until it is committed, its tables say so. Every other
JSON must exist. --show prints the tables whose NAMEs match its patterns, from --json_path if
given (bench.py --report prints its report this way). A module's FIGURES (png path -> (json
path, points, draw)) are figures: one whose PNG is not the picture drawn from the points its
JSON gives (drawn from others, damaged, cut short, replaced) is drawn again, or named by --check
(results/figure.py: the PNG holds its points and a digest of its pixels, so --check needs
Pillow, not matplotlib; draw imports matplotlib). A JSON cut short, or holding a NaN or infinite
number anywhere, is one line naming the file and the field (a report of bench.py is read as
its runner reads it: results/benchkit/reportfile.py). Standard library only, but for the figures'
Pillow and matplotlib.

A document whose markers do not pair up (an opening without its closing marker before the next
table, a closing marker without an opening) is refused, by --check as well: a rewrite would
replace the prose between two tables. Each module also says what its JSON holds (FIELDS:
{json path: (what it is, the top-level fields its tables read)}), so that a JSON of another
kind, or one cut short, is one line naming it instead of a wrong table or a traceback.
"""

import fnmatch
import importlib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from results.benchkit import reportfile  # noqa: E402
from results import figure  # noqa: E402
from nanotost import atomic, cli, outputs  # noqa: E402

# -----------------------------------------------------------------------------
# settings
check = False  # compare only: exit 1 naming each table that differs from its JSON
show = ""  # table NAMEs, comma separated, * and ? as in file names: print them to stdout, rewrite nothing
json_path = ""  # with show: render every table from this JSON instead of its own
root = ""  # the repository whose documents and JSON are used ("": the one this script is in)
# -----------------------------------------------------------------------------
SETTINGS = cli.config_defaults(globals())
DOCS = ("README.md", "SPEED.md", "results/recall/README.md", "lra/README.md")
MODULES = ("speed_tables", "cpu_tables", "lra_tables", "recall_tables", "pydocs_tables", "efficiency")
BLOCK = re.compile(r"(<!-- table: ([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)
MARKER = re.compile(r"<!--\s*(/?)\s*table\b.*?-->")  # any table marker, well formed or not
FIELDS = {}  # json path -> (what it is, the top-level fields its tables read), from the modules


def registry():
    """NAME -> (module, json path, fn) over every module; (json path -> command) of awaited JSON;
    the figures: png path -> (json path, points(data), draw(points, path)). Fills FIELDS from the modules."""
    tables, awaited, figures = {}, {}, {}
    for name in MODULES:
        module = importlib.import_module(f"results.{name}")
        for table, (path, fn) in module.TABLES.items():
            if table in tables:
                raise cli.UserError(f"table {table!r} is registered twice ({tables[table][0]} and {name})")
            tables[table] = (name, path, fn)
        awaited.update(getattr(module, "AWAITED", {}))
        FIELDS.update(module.FIELDS)
        figures.update(getattr(module, "FIGURES", {}))
    return tables, awaited, figures


def render_figures(figures, awaited, where, cache, check):
    """Each figure drawn again where its PNG is not the picture drawn from the points its JSON
    gives (stale, damaged, cut short, replaced: results/figure.py); with check, named instead.
    Returns (the names of those that differ, {png path: the bytes drawn}, written by the caller)."""
    differ, drawn = [], {}
    for png, (path, points, draw) in figures.items():
        if path not in cache:
            cache[path] = load_json(path, where, awaited)
        if cache[path] is None:
            continue
        with atomic.reading(path, restore(path)):
            now = points(cache[path])
        why = stale_figure(os.path.join(where, png), now)
        if why is None:
            print(f"{png}: figure, as rendered")
            continue
        differ.append(f"{png}: {why}" if why else f"{png} ({path})")
        if check:
            print(f"{png}: figure, {why or 'differs'}")
            continue
        drawn[os.path.join(where, png)], lacks = draw(now)
        print(f"{png}: figure, " + (f"{why}: " if why else "") + "redrawn"
              + (f" (not measured yet: {'; '.join(lacks)})" if lacks else ""))
    return differ, drawn


def stale_figure(path, points):
    """Why the PNG at path is not the picture drawn from `points`: None where it is; "" where it
    was drawn from other points, or is missing; else what is wrong with the file."""
    try:
        return None if figure.stored_points(path) == points else ""
    except figure.Damaged as e:
        return str(e)


def load_json(path, where, awaited):
    """The data at `path` (relative to `where`), or None for an awaited JSON not committed yet."""
    full = os.path.join(where, path)
    if not os.path.isfile(full):
        if path in awaited:
            return None
        raise cli.UserError(f"{path} does not exist: it is the JSON of a table; write it with the command "
                            "the document gives beside the table")
    return read_data(full, restore(path))


def read_data(path, fix):
    """The JSON at path as every table and figure reads it: cut short, not JSON, or holding a
    NaN or infinite number anywhere is one line naming the file (and the field) and `fix`. A
    report of bench.py is read as its runner reads it (results/benchkit/reportfile.py: the one reading
    of a report), except that a NaN or infinite figure refuses the file here (the runner
    measures that row again)."""
    data = atomic.read_json(path, fix, finite=True)
    if reportfile.is_report(data):
        reportfile.check(data, path, fix, refuse=True)
    return data


def restore(path):
    """What to do about a committed JSON that cannot be read."""
    return f"restore it with git checkout -- {path}, or write it again with the command its document gives"


def check_kind(data, registered, shown=None):
    """Refuse data that is not the kind of JSON at `registered` (FIELDS): one line naming what it
    lacks. `shown`: the file the data came from, where it is not `registered` (--json_path)."""
    what, fields = FIELDS[registered]
    missing = [f for f in fields if f not in data]
    if missing and shown:  # (the options first: the advice check reads a script's name as the options' owner)
        raise cli.UserError(f"{shown}: choose other tables with --show, or give --json_path a JSON they read: "
                            f"it is not {what} (it lacks {', '.join(missing)})")
    if missing:
        raise cli.UserError(f"{registered} is not {what} (it lacks {', '.join(missing)}): {restore(registered)}")


def render_table(name, tables, awaited, where, cache, data=None, shown=None):
    """The markdown of table `name` from its JSON (`cache`: path -> data, read once), or from
    `data` read from the file `shown` (--json_path)."""
    _, path, fn = tables[name]
    if data is None:
        if path not in cache:
            cache[path] = load_json(path, where, awaited)
        if cache[path] is None:
            return f"_No report is committed yet (`{path}`): {awaited[path]} writes it._"
        data = cache[path]
    check_kind(data, path, shown)
    with atomic.reading(shown or path, f"it is not {FIELDS[path][0]} as this version writes it" if shown
                     else restore(path)):
        return MARKER.sub(lambda m: m.group(0).replace("<", "&lt;"), fn(data).rstrip())  # (text from a JSON
        # that reads as a table marker, e.g. a command typed with one, must not end or open a block)


def check_markers(text, doc):
    """Refuse a document whose table markers do not pair up: each `<!-- table: NAME -->`
    followed by its `<!-- /table -->` before the next marker, both well formed."""
    opened = None  # (line, name) of the table open at this point of the text
    again = "put it back (git diff shows what changed); nothing was written"
    for m in MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        closing = bool(m.group(1))
        if not re.fullmatch(r"<!-- /table -->" if closing else r"<!-- table: [\w.-]+ -->", m.group(0)):
            raise cli.UserError(f"{doc}:{line}: {m.group(0)!r} is not a table marker the renderer reads "
                                "(<!-- table: NAME --> ... <!-- /table -->): correct it; nothing was written")
        if closing and opened is None:
            raise cli.UserError(f"{doc}:{line}: this <!-- /table --> closes no table (its opening marker is gone): "
                                f"{again}")
        if not closing and opened is not None:
            raise cli.UserError(f"{doc}:{opened[0]}: the table {opened[1]!r} has no <!-- /table --> before the next "
                                f"table (line {line}), and a rewrite would replace the text between: {again}")
        opened = None if closing else (line, m.group(0)[len("<!-- table: "):-len(" -->")])
    if opened is not None:
        raise cli.UserError(f"{doc}:{opened[0]}: the table {opened[1]!r} has no <!-- /table --> after it: {again}")


def render_doc(text, tables, awaited, where, cache, doc="the document"):
    """`text` with every table block rewritten; the names of the blocks whose text changed.
    A block whose NAME no module registers is an error."""
    check_markers(text, doc)
    changed = []

    def one(m):
        name = m.group(2)
        if name not in tables:
            raise cli.UserError(f"{doc}: table {name!r} is not registered by any of {', '.join(MODULES)} "
                                f"(registered: {', '.join(sorted(tables))})")
        new = m.group(1) + render_table(name, tables, awaited, where, cache) + "\n" + m.group(4)
        if new != m.group(0):
            changed.append(name)
        return new
    return BLOCK.sub(one, text), changed


def names_in(text):
    """The NAMEs of the table blocks in a document's text, in order."""
    return [m.group(2) for m in BLOCK.finditer(text)]


def main(argv):
    argv = [a + "=1" if a == "--check" else a for a in argv]
    cfg, _ = cli.configure(SETTINGS, argv)
    cli.check(cfg)  # no numeric settings: the check asserts that none was added unchecked
    where = os.path.abspath(cfg.root or REPO)
    tables, awaited, figures = registry()
    cache = {}
    if cfg.show:
        patterns = cli.parse_list("show", cfg.show, what="table names or patterns")
        chosen = [n for n in tables if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        cli.require(chosen, f"show: no table matches {cfg.show!r}; the tables: {', '.join(sorted(tables))}")
        data = None
        if cfg.json_path:
            cli.require(os.path.isfile(cfg.json_path), f"no JSON at {cfg.json_path}")
            data = read_data(cfg.json_path, "give --json_path a JSON that bench.py, results/recall/suite.py, "
                                              "lra/listops_runs.py or results/compare/pydocs.py wrote")
        for name in chosen:
            body = render_table(name, tables, awaited, where, cache, data, cfg.json_path or None)
            print(f"## {name}\n\n{body}\n")
        return
    cli.require(not cfg.json_path, "json_path goes with show (a module's tables to stdout)")
    differ, rendered = [], {}
    for doc in DOCS:  # every document rendered before any is written: an error writes nothing
        with open(os.path.join(where, doc), encoding="utf-8") as f:
            text = f.read()
        new, changed = render_doc(text, tables, awaited, where, cache, doc)
        differ += [f"{doc}: {name} ({tables[name][1]})" for name in changed]
        rendered[doc] = (new, changed, len(names_in(text)))
    for path in [os.path.join(where, d) for d in DOCS] + [os.path.join(where, png) for png in figures]:
        if not cfg.check:
            outputs.claim_output(path, "--root=<another checkout>")  # one writer at a time, every output first
    for doc, (new, changed, count) in rendered.items():
        print(f"{doc}: {count} table(s)" + (f", {'differ' if cfg.check else 'rewritten'}: {', '.join(changed)}"
                                            if changed else ", as rendered"))
    figures_differ, drawn = render_figures(figures, awaited, where, cache, cfg.check)
    if not cfg.check:  # the documents and the figures as one unit: all replaced, or (an error, Ctrl-C) none
        atomic.write_together({**{os.path.join(where, doc): new for doc, (new, changed, _) in rendered.items() if changed},
                            **drawn})
    differ += figures_differ
    if cfg.check and differ:
        raise cli.UserError(f"{len(differ)} table(s) or figure(s) differ from their JSON or are damaged: "
                            f"{'; '.join(differ)}; rewrite and redraw them with python results/render.py")


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
