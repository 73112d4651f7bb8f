"""
The documents' tables are their JSON (issue 27 item 5): every table block of README.md,
SPEED.md, results/recall/README.md and lra/README.md equals its rendering by results/render.py from the
committed JSON, so editing a number in a table (or in its JSON) fails here; every NAME in a
document is registered, every registered table appears in a document, and the JSON a table
names exists (or is awaited: a GPU report no machine here can write, whose tables say so).
Also: render.py --check names the table (or figure: results/efficiency.png, by the points in
its PNG, and the picture by the digest of its pixels) that differs and render.py repairs it; mistakes are
one line; lra/listops_runs.py's smoke run writes a JSON the LRA tables render; lra/README's
equal-budget table holds the parameter counts lra/train.py builds.

    python -m pytest -q tests/test_tables.py        # ~20 s
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from results import render  # noqa: E402
from results import figure  # noqa: E402
from lra import listops_runs  # noqa: E402
from lra import train as lra_train  # noqa: E402
from nanotost import cli  # noqa: E402

RENDER = os.path.join(REPO, "results", "render.py")
TABLES, AWAITED, FIGURES = render.registry()


def read(doc, where=REPO):
    with open(os.path.join(where, doc), encoding="utf-8") as f:
        return f.read()


def blocks(text):
    """NAME -> the text between the block's markers."""
    return {m.group(2): m.group(3) for m in render.BLOCK.finditer(text)}


@pytest.mark.parametrize("doc", render.DOCS)
def test_every_table_of_the_document_equals_its_json(doc):
    text = read(doc)
    new, changed = render.render_doc(text, TABLES, AWAITED, REPO, {}, doc)
    assert not changed, (f"{doc}: tables {changed} differ from their JSON "
                         f"({', '.join(TABLES[n][1] for n in changed)}): run python results/render.py")
    assert new == text


def test_every_name_in_a_document_is_registered_and_every_table_appears():
    found = {}
    for doc in render.DOCS:
        text = read(doc)
        names = render.names_in(text)
        assert len(names) == len(set(names)), f"{doc} holds a table twice: {names}"
        for name in names:
            assert name in TABLES, f"{doc}: table {name!r} is registered by no module of results/"
            found.setdefault(name, []).append(doc)
        # a block is well formed: every opening marker has its closing one
        assert text.count("<!-- table: ") == text.count("<!-- /table -->") == len(names), doc
    assert set(TABLES) <= set(found), f"registered tables in no document: {sorted(set(TABLES) - set(found))}"


def test_the_json_of_every_table_exists_or_is_awaited_and_then_said_to_be():
    for name, (module, path, _) in TABLES.items():
        if os.path.isfile(os.path.join(REPO, path)):
            with open(os.path.join(REPO, path), encoding="utf-8") as f:
                json.load(f)  # and it is JSON
            continue
        assert path in AWAITED, f"table {name} ({module}) names {path}, which does not exist"
        for doc in render.DOCS:
            if name in blocks(read(doc)):
                assert "No report is committed yet" in blocks(read(doc))[name], (doc, name)


def test_the_commands_that_wrote_the_json_stand_in_the_documents():
    """The command a table says wrote its JSON is the one the document gives to run."""
    from results import cpu_tables

    with open(os.path.join(REPO, cpu_tables.CPU_BENCH)) as f:
        assert cpu_tables.cpu_command(json.load(f)) in read("SPEED.md").split("```")[-2]
    with open(os.path.join(REPO, "lra", "results_listops.json")) as f:
        grids = json.load(f)["grids"]
    assert grids["tiny"]["command"] == grids["mini"]["command"] == "python lra/listops_runs.py --out=lra/results_listops.json"
    assert "python lra/listops_runs.py --out=lra/results_listops.json " in read("lra/README.md")
    for name, grid in grids.items():  # full runs of the committed code, on the documented data
        assert not grid["max_iters_override"] and grid["complete"] and not grid["dirty"]
        spec = listops_runs.GRIDS[name]
        assert grid["data"]["command"] == " ".join(["python lra/generate.py --task=listops",
                                                    f"--out_dir=data/{spec['folder']}", *spec["generate"]])


def copy_of_the_repository(tmp_path):
    """The documents and every table's JSON, in a folder render.py --root can use."""
    for path in set(render.DOCS) | {p for _, p, _ in TABLES.values()} | set(FIGURES):
        if os.path.isfile(os.path.join(REPO, path)):
            os.makedirs(os.path.dirname(tmp_path / path), exist_ok=True)
            shutil.copy(os.path.join(REPO, path), tmp_path / path)
    return tmp_path


def run_render(*args):
    return subprocess.run([sys.executable, RENDER, *args], capture_output=True, text=True)


def test_check_names_an_edited_number_and_render_repairs_it(tmp_path):
    root = copy_of_the_repository(tmp_path)
    doc = "lra/README.md"
    text = read(doc, root)
    body = blocks(text)["lra_listops_tiny"]
    edited = re.sub(r"\d", lambda m: str((int(m.group(0)) + 1) % 10), body, count=1)  # one digit, +1
    (root / doc).write_text(text.replace(body, edited), encoding="utf-8")
    check = run_render("--check", f"--root={root}")
    assert check.returncode == 1 and "lra/README.md: lra_listops_tiny" in check.stderr, check.stderr
    assert check.stderr.startswith("results/render.py: ") and len(check.stderr.strip().splitlines()) == 1
    assert read(doc, root) != text  # --check writes nothing
    fixed = run_render(f"--root={root}")
    assert fixed.returncode == 0 and "rewritten: lra_listops_tiny" in fixed.stdout, fixed.stdout + fixed.stderr
    assert read(doc, root) == text and run_render("--check", f"--root={root}").returncode == 0


def test_a_changed_json_makes_its_tables_differ(tmp_path):
    root = copy_of_the_repository(tmp_path)
    path = root / "lra/results_listops.json"
    data = json.loads(path.read_text())
    data["grids"]["tiny"]["runs"][0]["test_acc_at_best_val"] += 10  # 40 more test examples right
    path.write_text(json.dumps(data))
    check = run_render("--check", f"--root={root}")
    assert check.returncode == 1
    for where in ("lra/README.md: lra_listops_tiny", "README.md: lra_listops_summary"):
        assert where in check.stderr, check.stderr


def test_a_figure_is_checked_by_its_points_and_drawn_again_when_its_json_changes(tmp_path):
    pytest.importorskip("matplotlib")
    root = copy_of_the_repository(tmp_path)
    png = "results/efficiency.png"
    json_path, points, _ = FIGURES[png]
    with open(os.path.join(REPO, json_path)) as f:
        assert figure.stored_points(os.path.join(REPO, png)) == points(json.load(f))  # the committed figure is its JSON
    data = json.loads((root / json_path).read_text())
    trains = [part for name, part in data["sections"].items() if name.startswith("train")]  # a report's or a headline's
    row = next(r for part in trains for r in part["rows"] if r.get("ms"))
    row["ms"] /= 2  # one step twice as fast at one length
    (root / json_path).write_text(json.dumps(data))
    check = run_render("--check", f"--root={root}")
    assert check.returncode == 1 and f"{png} ({json_path})" in check.stderr, check.stderr
    fixed = run_render(f"--root={root}")
    assert fixed.returncode == 0 and f"{png}: figure, redrawn" in fixed.stdout, fixed.stdout + fixed.stderr
    assert figure.stored_points(str(root / png)) == points(data)
    assert run_render("--check", f"--root={root}").returncode == 0


def test_mistakes_are_one_line(tmp_path):
    root = copy_of_the_repository(tmp_path)
    (root / "SPEED.md").write_text(read("SPEED.md") + "\n<!-- table: nope -->\nx\n<!-- /table -->\n")
    p = run_render(f"--root={root}")
    assert p.returncode == 1 and "SPEED.md: table 'nope' is not registered" in p.stderr, p.stderr
    assert read("SPEED.md", root).endswith("x\n<!-- /table -->\n")  # nothing rewritten
    os.remove(root / "lra/results_listops.json")
    p = run_render("--check", f"--root={root}")
    assert p.returncode == 1 and "lra/results_listops.json does not exist" in p.stderr, p.stderr
    for args, words in ((["--show=nope"], "show: no table matches 'nope'"),
                        (["--show=cpu_op", f"--json_path={root / 'none.json'}"], "no JSON at"),
                        (["--json_path=x.json"], "json_path goes with show"),
                        (["--chek=1"], "unknown setting 'chek'")):
        p = run_render(*args)
        assert p.returncode == 1 and p.stderr.startswith("results/render.py: ") and words in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_show_prints_the_chosen_tables_from_the_committed_json():
    p = run_render("--show=lra_*")
    assert p.returncode == 0, p.stderr
    assert re.findall(r"^## (\S+)$", p.stdout, re.M) == [n for n in TABLES if n.startswith("lra_")]
    assert blocks(read("lra/README.md"))["lra_listops_tiny"].strip() in p.stdout


def test_the_listops_runner_writes_what_the_tables_render(tmp_path):
    out = tmp_path / "listops.json"
    p = subprocess.run([sys.executable, os.path.join(REPO, "lra", "listops_runs.py"), "--grids=tiny",
                        "--runs=shared_tssa", "--seeds=1", "--vector_paths=native", "--max_iters=20",
                        f"--data_root={tmp_path / 'data'}", f"--out={out}"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    grid = json.loads(out.read_text())["grids"]["tiny"]
    assert grid["complete"] and grid["max_iters_override"] == 20 and grid["threads"] == 1
    assert grid["data"]["splits"]["test"]["n"] == 400 and len(grid["data"]["sha256"]) == 3
    [run] = grid["runs"]
    assert run["command"] == ("python lra/train.py lra/configs/listops_tiny_shared.py --attn=tssa --seed=1 "
                              "--max_iters=20")
    assert run["iters"] == 20 and run["params"] == 60370 and 0 <= run["test_acc_at_best_val"] <= 100
    # the majority class, counted here from the generated labels
    with open(tmp_path / "data" / "listops_tiny" / "listops-1000" / "basic_train.tsv") as f:
        labels = [line.rsplit("\t", 1)[1].strip() for line in f.readlines()[1:]]
    assert str(grid["data"]["majority_label"]) == max(set(labels), key=labels.count)
    shown = run_render("--show=lra_listops_tiny", f"--json_path={out}")
    assert shown.returncode == 0 and "a smoke run" in shown.stdout and "60,370" in shown.stdout, shown.stderr
    bad = subprocess.run([sys.executable, os.path.join(REPO, "lra", "listops_runs.py"), "--grids=huge"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("lra/listops_runs.py: grids: unknown 'huge'"), bad.stderr


def test_the_equal_budget_table_holds_the_counts_lra_train_builds():
    """lra/README.md's parameter counts (not a measurement: what the configs build)."""
    text = read("lra/README.md")
    section = text[text.index("**Equal parameter budgets.**"):text.index("**The paper's settings**")]
    tasks = {"ListOps": "listops", "Text": "text", "Retrieval": "retrieval", "Image": "image",
             "Pathfinder": "pathfinder", "Path-X (not in the paper)": "pathx"}
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r[0][2:] for r in rows] == list(tasks)
    for cells in rows:
        task = tasks[cells[0][2:]]
        config = lambda name, *over: cli.configure(  # noqa: E731
            lra_train.DEFAULTS, [os.path.join(REPO, "lra", "configs", f"{task}_{name}.py"), *over])[0]
        settings = {name: config(name) for name in ("tost", "softmax")}
        same_mlp = config("softmax", f"--mlp_hidden={settings['tost'].mlp_hidden}")
        counts = [lra_train.count_params(c) for c in (settings["tost"], settings["softmax"], same_mlp)]
        assert cells[1] == f"{counts[0]:,}", (task, cells[1], counts[0])
        assert cells[2] == f"{counts[1]:,} (MLP {settings['softmax'].mlp_hidden})", (task, cells[2], counts[1])
        assert cells[3].rstrip(" |") == f"{counts[2]:,} (+{100 * (counts[2] / counts[0] - 1):.1f}%)", (task, cells[3])
