"""
The house a student walks (issue 51), measured from the code: the top level holds the story and
the commands a user types, and nothing else; the plumbing lives in nanotost/, the studies in
results/; imports only go down the floors below (no circle, no room that knows one above it); the
settings module holds the settings and the error path alone, and every other module of the
plumbing is one concern of a readable size. A new file must be given its floor here: the test says so.

    python -m pytest -q tests/test_house.py
"""

import ast
import fnmatch
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what the top level holds: the story (README, the maths, model.py, the scripts a user types), the
# configs, the folders of LRA, the kernels and the tests, the plumbing's package, the studies
TOP_LEVEL = {"README.md", "MATH.md", "SPEED.md", "model.py", "train.py", "sample.py", "evaluate.py",
             "prepare_openwebtext.py", "prepare_char.py", "vit_train.py", "vit_inspect.py", "lm_inspect.py",
             "export.py", "bench.py", "lm_harness.py", "test_tssa.py", "config", "lra", "kernels", "tests",
             "requirements.txt", "requirements-dev.txt", "nanotost", "results", ".ci", ".gitignore"}

# the floors, lowest first: a file imports files of its own floor or below, never above
FLOORS = (
    ("model.py",),  # the maths: imports nothing of the project
    ("nanotost/__init__.py", "nanotost/portable.py"),
    ("nanotost/cli.py", "nanotost/lists.py"),
    ("nanotost/atomic.py", "nanotost/plots.py"),
    ("nanotost/outputs.py", "nanotost/ranks.py", "nanotost/devices.py", "nanotost/model_settings.py",
     "nanotost/forks.py", "nanotost/schema.py"),
    ("kernels/*.py",),
    ("nanotost/checkpoints.py", "nanotost/textdata.py", "nanotost/vit_data.py"),
    ("nanotost/hub.py",),
    ("nanotost/loading.py", "nanotost/trainkit.py", "nanotost/whitebox.py"),
    ("nanotost/lm_eval_adapter.py",),
    ("lra/__init__.py", "lra/data.py", "lra/encoder.py", "results/markdown.py", "results/figure.py"),
    ("results/benchkit/*.py",),
    ("results/*_tables.py", "results/efficiency.py", "results/design_probe.py", "results/recall/*.py",
     "results/compare/*.py", "lra/train.py", "lra/generate.py", "lra/summary.py", "lra/listops_runs.py"),
    ("results/render.py",),
    ("*.py",),  # the scripts a user types
)
SETTINGS_MODULE, SETTINGS_LINES = "nanotost/cli.py", 450  # settings and the error path alone
MODULE_LINES = 600  # every other module of the plumbing: one concern a reader takes in


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [f for f in out if os.path.exists(os.path.join(REPO, f))]


def modules():
    """The project's Python files that are not tests or configs: {path: module name}."""
    found = {}
    for f in tracked():
        if not f.endswith(".py") or f.startswith(("tests/", "config/", "lra/configs/")):
            continue
        if os.path.basename(f).startswith("test_") or os.path.basename(f) == "conftest.py":
            continue
        name = f[:-3].replace("/", ".")
        found[f] = name[:-len(".__init__")] if name.endswith(".__init__") else name
    return found


def imports(path, names):
    """The project files that `path` imports (at its top or inside a function)."""
    by_name = {name: f for f, name in names.items()}
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = names[path].rpartition(".")[0] if not path.endswith("__init__.py") else names[path]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            wanted = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in wanted:
            while name and name not in by_name:
                name = name.rpartition(".")[0]
            if name:
                out.add(by_name[name])
    out.discard(path)
    return out


def floor_of(path):
    """The floor of a file (the first pattern that matches it), or None: a file the house has not placed."""
    return next((i for i, patterns in enumerate(FLOORS) if any(fnmatch.fnmatch(path, p) and
                                                                 p.count("/") == path.count("/") for p in patterns)),
                None)


def lines(path):
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_the_top_level_holds_the_story_and_the_commands_a_user_types():
    top = {f.split("/")[0] for f in tracked()}
    assert top - TOP_LEVEL == set(), f"new at the top level: {sorted(top - TOP_LEVEL)}: move it where it belongs"
    assert {"model.py", "train.py", "sample.py", "nanotost", "results"} <= top


def test_every_module_has_a_floor():
    unplaced = [f for f in modules() if floor_of(f) is None]
    assert unplaced == [], f"give these a floor in tests/test_house.py's FLOORS: {unplaced}"


def test_imports_only_go_down_the_floors_and_make_no_circle():
    names = modules()
    graph = {f: imports(f, names) for f in names}
    up = sorted((f, g) for f in graph for g in graph[f] if floor_of(g) > floor_of(f))
    assert up == [], "imports that run back up the floors (file -> what it imports): " + \
        ", ".join(f"{f} ({floor_of(f)}) -> {g} ({floor_of(g)})" for f, g in up)
    assert graph["model.py"] == set(), "model.py imports nothing of the project"
    # no circle: a depth-first walk meets no file that is still on its path
    state, circles = {}, []

    def walk(f, path):
        state[f] = "open"
        for g in sorted(graph[f]):
            if state.get(g) == "open":
                circles.append(path[path.index(g):] + [g])
            elif g not in state:
                walk(g, path + [g])
        state[f] = "done"
    for f in sorted(graph):
        if f not in state:
            walk(f, [f])
    assert circles == [], f"import circles: {circles}"


def test_the_settings_module_is_small_and_every_other_module_is_one_readable_concern():
    assert lines(SETTINGS_MODULE) < SETTINGS_LINES
    large = {f: lines(f) for f in modules() if f.startswith("nanotost/") and lines(f) >= MODULE_LINES}
    assert large == {}, f"modules of {MODULE_LINES} lines or more (split each by its concerns): {large}"


def test_the_house_finds_what_it_looks_for():
    """The checks above can fail: a made-up import up the floors is one, an unplaced file is one."""
    assert floor_of("nanotost/cli.py") < floor_of("nanotost/trainkit.py") < floor_of("train.py")
    assert floor_of("kernels/fused.py") == floor_of("kernels/auto.py")
    assert floor_of("somewhere/new.py") is None
    names = modules()
    assert "nanotost/cli.py" in imports("train.py", names) and "model.py" in imports("train.py", names)
    assert imports("nanotost/cli.py", names) <= {"nanotost/__init__.py", "nanotost/portable.py", "nanotost/lists.py"}
