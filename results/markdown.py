"""
The markdown every table module writes: a table from its header and rows, and a figure over
seeds as its mean and range. Standard library only (results/render.py needs no torch).
"""

import statistics


def table(header, rows):
    """A markdown table: the header, its rule, then one line per row (each cell through str)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def spread(values, fmt):
    """The mean and (min–max) of the values, each through fmt, e.g. "1.976 (1.961–1.990)"; one
    value alone."""
    text = fmt.format(statistics.mean(values))
    return text if len(values) == 1 else f"{text} ({fmt.format(min(values))}–{fmt.format(max(values))})"
