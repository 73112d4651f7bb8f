"""
The markdown every table module writes: a table from its header and rows, a figure over seeds
as its mean and range, and a ratio of times worded as it reads (bench.py prints the same
words). Standard library only (results/render.py needs no torch).
"""

import re
import statistics


def table(header, rows):
    """A markdown table: the header, its rule, then one line per row (each cell through cell)."""
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


def cell(value):
    """str(value) as the text of one table cell, whatever a JSON holds (a device's name, a command
    as typed): a `|` or a line break would split the row, a `<` could open HTML or a comment that
    ends the table's block (render.py's markers), so they are escaped (a `<` before a letter, `/`,
    `!` or `?`: "<= 0.15 ms" stays as written)."""
    return " ".join(re.sub(r"<(?=[A-Za-z/!?])", "&lt;", str(value).replace("|", "\\|")).split())


def spread(values, fmt):
    """The mean and (min–max) of the values, each through fmt, e.g. "1.976 (1.961–1.990)"; one
    value alone."""
    text = fmt.format(statistics.mean(values))
    return text if len(values) == 1 else f"{text} ({fmt.format(min(values))}–{fmt.format(max(values))})"


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
