"""
The text of a list-valued setting (cli.parse_list's rule, the one every script follows), in two
parts that need nothing of the project:

  split_items  "a,b,c" -> its items; where the items are paths (a task's YAML file, an input
               file), commas inside a name that exists stay in it: "my,task.yaml" is one item
  shown, few, quoted  a few items of a long list and how many there are: a refusal stays one
               short line whatever the user typed (5,000 layers, a glob that matched thousands)

Both take time in proportion to the text (each folder listed once; no check that compares
every item with every other).
"""

import bisect
import os

SHOWN = 3  # items a refusal quotes before "... (N items)"
SHOWN_CHARS = 40  # of each quoted item


def split_items(text, paths=False):
    """The items of a comma-separated text, each stripped. paths=True: consecutive pieces that
    together name an existing file or folder (commas in its name) are one item."""
    pieces = text.split(",")
    if not paths:
        return [p.strip() for p in pieces]
    listings = {}  # folder -> its sorted entries (each folder listed once)
    items, i = [], 0
    while i < len(pieces):
        end, candidate, j = i, pieces[i], i
        while j + 1 < len(pieces) and _continues(candidate.strip(), listings):
            j += 1
            candidate += "," + pieces[j]
            if os.path.exists(candidate.strip()):
                end = j
        items.append(",".join(pieces[i:end + 1]).strip())
        i = end + 1
    return items


def _continues(candidate, listings):
    """Whether an entry of the candidate's folder begins with its last part and a comma: only then
    can a longer candidate name something that exists (a bisection in the folder's listing)."""
    folder, start = os.path.split(candidate)
    if folder not in listings:
        try:
            listings[folder] = sorted(os.listdir(folder or "."))
        except OSError:  # (no such folder, or one that cannot be listed)
            listings[folder] = []
    names, start = listings[folder], start + ","
    k = bisect.bisect_left(names, start)
    return k < len(names) and names[k].startswith(start)


def shown(text, items):
    """How a refusal shows the list the user gave: as typed where short, else a few of its items."""
    return repr(text) if len(repr(text)) <= 2 * SHOWN_CHARS else quoted(items)


def few(names):
    """Names as given, joined: a few of them and how many there are when there are more."""
    names = list(names)
    return ", ".join(names[:SHOWN]) + (f", ... ({len(names):,} in all)" if len(names) > SHOWN else "")


def quoted(items):
    """A few of `items`, each quoted (and cut short), and how many there are when there are more."""
    shown = []
    for item in list(items)[:SHOWN]:
        text = repr(item)
        shown.append(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 4] + "...'")
    more = len(items) - len(shown)
    return ", ".join(shown) + (f", ... ({len(items):,} in all)" if more > 0 else "")
