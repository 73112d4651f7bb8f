"""
What results/render.py reads, damaged (issue 40 item 4), one test per class over its members:

  1. a figure's PNG that is not the picture drawn from its points (cut short, a damaged byte in
     the stored points, the pixels or the checksums, empty, another kind of file, another
     picture under the same points): --check names it in one line ("redraw it with ..."), the
     rewrite draws it again, byte for byte the committed one, and --check passes after
  2. a report whose training sections have not all run (none, one model only, no peak memory,
     a length one model lacks): the rewrite draws what there is and says what is missing; a row
     that lacks a field is one line naming it
  3. a NaN or infinite number (NaN, Infinity, -Infinity, 1e999) in any JSON a table or figure
     is registered with, or given to --show: refused where it is read, one line naming the file
     and the field

In this process (cli.run_cli, as the command line runs it), in a copy of the documents and
their JSON.

    python -m pytest -q tests/test_render_inputs.py
"""

import json
import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from results import figure, render  # noqa: E402
from nanotost import atomic, cli  # noqa: E402
from test_errors import call, refused  # noqa: E402
from test_tables import copy_of_the_repository  # noqa: E402

SCRIPT = "results/render.py"
TABLES, AWAITED, FIGURES = render.registry()
PNG = "results/efficiency.png"
REPORT = FIGURES[PNG][0]


def committed(rel):
    with open(os.path.join(REPO, rel), "rb") as f:
        return f.read()


# -----------------------------------------------------------------------------
# 1. a figure that is not its picture


def flip(data, at):
    """data with the byte at `at` changed."""
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1:]


def other_picture(data):
    """A PNG of other pixels that holds the same points (and their digest): another picture put
    in the figure's place, as an editor that keeps the text chunks writes it."""
    import io

    from PIL import Image, PngImagePlugin
    image = Image.open(io.BytesIO(data))
    text = PngImagePlugin.PngInfo()
    for key, value in image.text.items():
        text.add_text(key, value)
    out = io.BytesIO()
    Image.new("RGBA", image.size, "white").save(out, format="PNG", pnginfo=text)
    return out.getvalue()


DAMAGES = {  # what is done to the committed PNG's bytes, and words of the refusal
    "cut to 1,000 bytes": (lambda d: d[:1000], "cut short or damaged"),
    "cut before its end": (lambda d: d[:-30], "cut short or damaged"),
    "a byte of the stored points": (lambda d: flip(d, d.index(figure.POINTS.encode()) + 30), "damaged"),
    "a byte of the pixels": (lambda d: flip(d, len(d) // 2), "damaged"),
    "a byte of the last checksum": (lambda d: flip(d, len(d) - 2), "damaged"),
    "empty": (lambda d: b"", "damaged, or another kind of file"),
    "another kind of file": (lambda d: b"<svg></svg>\n", "damaged, or another kind of file"),
    "another picture, the same points": (other_picture, "its pixels are not those it was drawn with"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_figure_that_is_not_its_picture_is_one_line_and_drawn_again(damage, tmp_path, capsys):
    root = copy_of_the_repository(tmp_path)
    change, words = DAMAGES[damage]
    (root / PNG).write_bytes(change(committed(PNG)))
    message = refused(SCRIPT, "--check", f"--root={root}", root=root, contains=[f"{PNG}: ", words])
    assert message.endswith("redraw them with python results/render.py"), message
    assert call(SCRIPT, f"--root={root}") == (0, "")
    assert f"{PNG}: figure, " in capsys.readouterr().out
    assert (root / PNG).read_bytes() == committed(PNG)  # drawn again: the same bytes (no date, no version)
    assert call(SCRIPT, "--check", f"--root={root}") == (0, "")


def test_the_committed_figure_is_the_picture_of_its_points():
    with open(os.path.join(REPO, REPORT), encoding="utf-8") as f:
        points = FIGURES[PNG][1](json.load(f))
    assert figure.stored_points(os.path.join(REPO, PNG)) == points


@pytest.mark.parametrize("fault", ["interrupt", "disk-full", "a drawing error"])
def test_a_rewrite_cut_short_leaves_the_documents_and_the_figure_as_they_were(fault, tmp_path, monkeypatch, capsys):
    """The documents and the figures are one unit (atomic.write_together): a fault while drawing or
    writing leaves every one of them as it was, not new tables beside an old figure."""
    root = copy_of_the_repository(tmp_path)
    (root / PNG).write_bytes(committed(PNG)[:1000])  # the figure must be drawn again
    doc = "lra/README.md"
    text = (root / doc).read_text(encoding="utf-8")
    (root / doc).write_text(text.replace("<!-- /table -->", "stale\n<!-- /table -->", 1), encoding="utf-8")
    before = {rel: (root / rel).read_bytes() for rel in (doc, PNG)}
    if fault == "a drawing error":
        monkeypatch.setitem(FIGURES, PNG, FIGURES[PNG][:2] + ((lambda points: 1 / 0),))
        monkeypatch.setattr(render, "registry", lambda: (TABLES, AWAITED, FIGURES))
        with pytest.raises(ZeroDivisionError):
            call(SCRIPT, f"--root={root}")
    else:
        error = KeyboardInterrupt() if fault == "interrupt" else OSError(28, "No space left on device")
        seen = []
        monkeypatch.setattr(atomic, "keep_owner_and_mode", lambda fd, old: seen.append(old) or (
            len(seen) == 2 and (_ for _ in ()).throw(error)))
        code, message = call(SCRIPT, f"--root={root}")
        assert code == (130 if fault == "interrupt" else 1) and len(seen) == 2, message
    assert {rel: (root / rel).read_bytes() for rel in (doc, PNG)} == before
    assert not [n for n in os.listdir(root / "results") + os.listdir(root / "lra") if ".tmp" in n]


# -----------------------------------------------------------------------------
# 2. a report whose training sections have not all run


def train_rows(data):
    return [r for name, part in data["sections"].items() if name.startswith("train") for r in part["rows"]]


def both_models(data):
    """The report with a GPT-2 row beside its first ToST row (the committed one has ToST's only)."""
    tost = next(r for r in train_rows(data) if r.get("arch") == "tost" and r.get("status") == "ok")
    data["sections"]["train"]["rows"].append(dict(tost, arch="gpt2", impl=None, backend="cudnn", ms=2 * tost["ms"]))
    return tost


def keep_rows(data, keep):
    for name, part in data["sections"].items():
        if name.startswith("train"):
            part["rows"] = [r for r in part["rows"] if keep(r)]


PARTIAL = {  # what is done to the report (with both models), and what the figure then says is missing
    "no training row has run": (lambda d, tost: keep_rows(d, lambda r: False),
                                ["ToST-Base: no training row has run", "GPT-2 Base: no training row has run"]),
    "ToST-Base only": (lambda d, tost: keep_rows(d, lambda r: r.get("arch") == "tost"),
                       ["GPT-2 Base: no training row has run"]),
    "GPT-2 Base only": (lambda d, tost: keep_rows(d, lambda r: r.get("arch") == "gpt2"),
                        ["ToST-Base: no training row has run"]),
    "no peak memory": (lambda d, tost: [r.pop("peak_mb", None) for r in train_rows(d)],
                       ["ToST-Base's peak GB allocated at T=4,096", "GPT-2 Base's peak GB allocated at T=4,096"]),
    "a length one model lacks": (lambda d, tost: d["sections"]["train"]["rows"].append(dict(tost, T=2 * tost["T"])),
                                 ["GPT-2 Base at T=8,192"]),
}


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_a_partial_report_draws_what_it_has_and_says_what_is_missing(case, tmp_path, capsys):
    root = copy_of_the_repository(tmp_path)
    change, said = PARTIAL[case]
    data = json.loads((root / REPORT).read_text())
    change(data, both_models(data))
    (root / REPORT).write_text(json.dumps(data))
    os.remove(root / PNG)  # (drawn afresh, whether or not the committed one has these points)
    assert call(SCRIPT, f"--root={root}") == (0, "")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(f"{PNG}: figure"))
    assert "redrawn (not measured yet: " in line, out
    for words in said:
        assert words in line, line
    assert figure.stored_points(str(root / PNG)) == FIGURES[PNG][1](data)
    assert call(SCRIPT, "--check", f"--root={root}") == (0, "")


def test_a_training_row_without_its_length_is_one_line_naming_the_field(tmp_path):
    """The figure's points are read as the tables are (atomic.reading): a field a row lacks is one
    line naming the file and the field, not a KeyError from the figure."""
    data = json.loads(committed(REPORT))
    both_models(data)
    del train_rows(data)[-1]["T"]
    with pytest.raises(cli.UserError, match=f"^{REPORT} lacks the field 'T': restore it"):
        render.render_figures(FIGURES, AWAITED, str(tmp_path), {REPORT: data}, check=True)


# -----------------------------------------------------------------------------
# 3. NaN or infinite numbers, in every JSON a table or figure reads


def first_number(data, field=()):
    """The path (keys) to the first float in JSON data, or None."""
    if isinstance(data, float):
        return field
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = first_number(value, field + (key,))
        if found is not None:
            return found
    return None


def shown(field):
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in field).lstrip(".")


FORMS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "1e999": "Infinity"}  # written: read as
PATHS = sorted({path for _, path, _ in TABLES.values()})
CASES = [(path, sorted(FORMS)[i % len(FORMS)]) for i, path in enumerate(PATHS)]  # every JSON, every form


@pytest.mark.parametrize("path,form", CASES)
def test_a_non_finite_number_in_any_json_is_refused_naming_the_file_and_field(path, form, tmp_path):
    root = copy_of_the_repository(tmp_path)
    if not (root / path).is_file():
        pytest.skip(f"{path} is awaited")
    data = json.loads((root / path).read_text())
    field = first_number(data)
    at = data
    for key in field[:-1]:
        at = at[key]
    at[field[-1]] = "@@@"
    (root / path).write_text(json.dumps(data).replace('"@@@"', form))
    for argv in (["--check"], []):
        refused(SCRIPT, *argv, f"--root={root}", root=root,
                contains=[f"{path}: {shown(field)} is {FORMS[form]}, not a finite number", "git checkout"])
    refused(SCRIPT, "--show=*", f"--json_path={root / path}", root=root,  # as bench.py --report prints a report
            contains=[f"{shown(field)} is {FORMS[form]}", "give --json_path a JSON"])


def test_non_finite_finds_the_field_at_any_depth():
    field, value = atomic.non_finite({"a": [1.0, {"b": float("nan")}]})
    assert field == "a[1].b" and math.isnan(value)
    assert atomic.non_finite({"a": [1, 2.5, "NaN"], "b": True}) is None  # a string "NaN" is not a number
    assert atomic.non_finite([float("-inf")]) == ("[0]", float("-inf"))


# -----------------------------------------------------------------------------
# 4. text from a JSON is text in the documents (issue 40, class 3)

@pytest.mark.parametrize("text", ["H200 | 2 GPUs", "line\nbreak", "<!-- /table -->", "<!-- table: gpu_op -->",
                                  "<script>alert(1)</script>", "a <b>bold</b> name", "<= 0.15 ms"])
def test_text_from_a_json_never_breaks_a_table_or_its_block(text, tmp_path, capsys):
    """A free text a report holds (here the device's name, as the GPU reports it) reaches a
    table cell: a `|` or a line break would split the row, a marker would end or open a block
    (the next rewrite would then replace prose), markup would render. Escaped where it is
    written (results/markdown.cell, render's block text); the documents stay well formed."""
    root = copy_of_the_repository(tmp_path)
    with open(root / REPORT, encoding="utf-8") as f:
        report = json.load(f)
    report["meta"]["name"] = text
    with open(root / REPORT, "w", encoding="utf-8") as f:
        json.dump(report, f)
    names = {doc: render.names_in((root / doc).read_text(encoding="utf-8")) for doc in render.DOCS}
    assert call(SCRIPT, f"--root={root}") == (0, "")
    for doc in render.DOCS:
        written = (root / doc).read_text(encoding="utf-8")
        assert render.names_in(written) == names[doc]  # every block, each once, none opened or closed by the text
        render.check_markers(written, doc)
    row = next(line for line in (root / "SPEED.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| device |"))
    assert row.count(" | ") == 1 and row.endswith(" |")  # one row of two cells
    assert "<script" not in row and "<b>" not in row and "<!--" not in row
    assert call(SCRIPT, "--check", f"--root={root}") == (0, "")  # and rendering again changes nothing
    capsys.readouterr()
