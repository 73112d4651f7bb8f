"""
One rule for every list-valued option of every script (issue 47, class 9): an item given twice
is one line, before any work, whatever the option (names, numbers, key:value pairs, a repeated
option). Every list is parsed by cli.parse_list, and the options are found in the code, not
listed here by hand:

  * no project file but cli.py splits a setting at commas (a list parsed elsewhere would have
    rules of its own);
  * every call of cli.parse_list (or of a function that hands it its key: name_list,
    seed_list, benchkit's lengths, recall's names, whitebox's layer_numbers, ...) with a
    setting's name is found, and gives the option to each script that reaches that code;
  * each option found is given with an item twice: one line naming it.

An option whose default names no item ("", "all", "auto") takes its item from EXAMPLES; a new
such option fails test_every_list_option_has_an_item until it has one.

    python -m pytest -q tests/test_list_options.py
"""

import ast
import importlib
import os
import sys

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nanotost import cli  # noqa: E402

PARSERS = {"parse_list": {0}, "name_list": {0}, "seed_list": {0}}  # cli's list parsers -> where their key is
NOT_OURS = {"lm_harness.py": "its options are lm-eval's own"}
# (script, option) -> (an item, the other settings the script needs to reach the check)
EXAMPLES = {("bench.py", "model_T"): ("64", []), ("bench.py", "decode_T"): ("32", []),
            ("bench.py", "impls"): ("torch", []), ("bench.py", "sections"): ("op", ["--report=1"]),
            ("bench.py", "section_s"): ("op:200", ["--report=1"]), ("evaluate.py", "harness"): ("lambada_openai", []),
            ("lm_inspect.py", "layers"): ("1", []), ("vit_inspect.py", "layers"): ("1", ["--ckpt=x"]),
            ("lra/listops_runs.py", "runs"): ("shared_tssa", []),
            ("lra/listops_runs.py", "vector_paths"): ("matmul", []),
            ("prepare_openwebtext.py", "input"): ("book.txt", []), ("results/render.py", "show"): ("speed*", [])}


def project_files():
    """The project's Python files (the tests aside), relative to the repository."""
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")) and d not in ("tests", "out", "data"))
        for name in sorted(files):
            if name.endswith(".py") and not name.startswith("test_"):
                yield os.path.relpath(os.path.join(folder, name), REPO).replace(os.sep, "/")


TREES = {path: ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read()) for path in project_files()}


def called(node):
    """The name a call calls (f(...) or x.f(...)), or None."""
    return getattr(node.func, "attr", getattr(node.func, "id", None)) if isinstance(node, ast.Call) else None


def keys_of(call, indices):
    """The arguments of a call at `indices` (or given as key=)."""
    return [call.args[i] for i in indices if len(call.args) > i] + [k.value for k in call.keywords if k.arg == "key"]


def list_parsers():
    """{function name: {the index of the argument that names its option}} of cli's parsers and of
    every function that hands one of its own arguments to one as the key (two functions of one
    name: both indices)."""
    takes, changed = {name: set(at) for name, at in PARSERS.items()}, True
    while changed:
        changed = False
        for tree in TREES.values():
            for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name not in PARSERS):
                params = [a.arg for a in fn.args.args]
                for call in (n for n in ast.walk(fn) if called(n) in takes):
                    for key in keys_of(call, takes[called(call)]):
                        if isinstance(key, ast.Name) and key.id in params and \
                                params.index(key.id) not in takes.get(fn.name, set()):
                            takes.setdefault(fn.name, set()).add(params.index(key.id))
                            changed = True
    return takes


def options_parsed(path, takes):
    """The option names the code of one file hands to a list parser (a setting's name, given as
    written: "layers", "--input")."""
    found = set()
    for call in (n for n in ast.walk(TREES[path]) if called(n) in takes):
        keys = keys_of(call, takes[called(call)])
        found |= {k.value.lstrip("-") for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return found


def imported(path):
    """The project files a file imports (import x.y, from x import y), itself included, transitively."""
    seen, todo = set(), [path]
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        for node in ast.walk(TREES[here]):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] + [node.module] if \
                isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                for candidate in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
                    if candidate in TREES:
                        todo.append(candidate)
    return seen


def settings_of(script):
    """{setting: default} of a script: its module's settings (cli.configure), or its ArgumentParser's."""
    module = importlib.import_module(script[:-3].replace("/", "."))
    if hasattr(module, "parser"):
        return {a.dest: a.default for a in module.parser()._actions if a.dest != "help"}
    return cli.config_defaults(vars(module))


def scripts():
    return [p for p in TREES if "cli.run_cli(" in ast.unparse(TREES[p]) and p != "nanotost/cli.py" and p not in NOT_OURS]


def list_options():
    """[(script, option)] of every list-valued option of every script."""
    takes = list_parsers()
    found = []
    for script in scripts():  # (the options its own code and the project's code it imports parse)
        parsed = set().union(*(options_parsed(p, takes) for p in imported(script)))
        found += [(script, option) for option in sorted(parsed & set(settings_of(script)))]
    return found


OPTIONS = list_options()


def test_no_code_but_cli_splits_a_setting_at_commas():
    """Each comma-separated list goes through cli.parse_list (and its rule, whose splitting is nanotost/lists.py's)."""
    rule = ("nanotost/cli.py", "nanotost/lists.py")
    splits = [(path, node.lineno) for path, tree in TREES.items() if path not in rule for node in ast.walk(tree)
              if called(node) == "split" and node.args and isinstance(node.args[0], ast.Constant)
              and node.args[0].value == ","]
    assert splits == []


def test_the_list_options_are_found():
    """(the discovery can fail: these, of several kinds and places, are among what it finds)"""
    for member in [("bench.py", "section_s"), ("bench.py", "sections"), ("bench.py", "T"), ("lm_inspect.py", "layers"),
                   ("vit_inspect.py", "layers"), ("results/recall/suite.py", "learning_rates"), ("evaluate.py", "harness"),
                   ("prepare_openwebtext.py", "input"), ("results/compare/pydocs.py", "seeds"), ("results/render.py", "show")]:
        assert member in OPTIONS
    assert len(OPTIONS) >= 25


def item_of(script, option):
    """(an item of the option, the other settings the script needs): from EXAMPLES, or the
    first item of its default."""
    if (script, option) in EXAMPLES:
        return EXAMPLES[(script, option)]
    default = settings_of(script)[option]
    first = str(default).split(",")[0].strip()
    return (first, []) if first and first not in ("all", "auto", "None") else (None, [])


def test_every_list_option_has_an_item():
    assert [pair for pair in OPTIONS if item_of(*pair)[0] is None] == []


@pytest.mark.parametrize("script, option", OPTIONS, ids=[f"{s}--{o}" for s, o in OPTIONS])
def test_an_item_given_twice_is_one_line_before_any_work(script, option, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "book.txt").write_text("a text\n")
    item, others = item_of(script, option)
    twice = [f"--{option}={item}"] * 2 if isinstance(settings_of(script)[option], (list, type(None))) and \
        option == "input" else [f"--{option}={item},{item}"]
    module = importlib.import_module(script[:-3].replace("/", "."))
    monkeypatch.setattr(sys, "argv", [script, *others, *twice])
    try:
        cli.run_cli(module.main, [*others, *twice])
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err + (code if isinstance(code, str) else "")
    key = item.split(":")[0]
    assert isinstance(code, str) and err.count("\n") == 0 and f" names {key} more than once" in err, (code, err)
    assert os.listdir(tmp_path) == ["book.txt"]  # nothing written


# -----------------------------------------------------------------------------
# issue 54, class 9: a list of any length is refused in one short line, a path with commas is one
# item, and the rule's checks take time in proportion to the list


def many(item, n):
    """n distinct items of an option's kind, made from its example item (a number, key:value, a name)."""
    key, sep, value = item.rpartition(":")
    if sep:
        return [f"{key}{i}:{value}" for i in range(n)]
    try:
        return [str(int(item) + i) for i in range(n)]
    except ValueError:
        pass
    try:
        return [repr(float(item) + i) for i in range(n)]
    except ValueError:
        return [f"{item}{i}" for i in range(n)]


@pytest.mark.parametrize("script, option", OPTIONS, ids=[f"{s}--{o}" for s, o in OPTIONS])
def test_a_list_of_thousands_is_refused_in_one_short_line(script, option, tmp_path, monkeypatch, capsys):
    """5,000 items and the first again: the line names the item given twice, quotes a few items
    and says how many, in a few hundred characters (it echoed the whole list: 24 KB)."""
    monkeypatch.chdir(tmp_path)
    item, others = item_of(script, option)
    items = many(item, 5000)
    items.append(items[0])
    repeated = isinstance(settings_of(script)[option], (list, type(None))) and option == "input"
    given = [f"--{option}={i}" for i in items] if repeated else [f"--{option}={','.join(items)}"]
    module = importlib.import_module(script[:-3].replace("/", "."))
    monkeypatch.setattr(sys, "argv", [script, *others])
    with pytest.raises(SystemExit) as e:
        cli.run_cli(module.main, [*others, *given])
    err = capsys.readouterr().err + (e.value.code if isinstance(e.value.code, str) else "")
    assert err.count("\n") == 0 and len(err) < 400, err[:600]
    assert f" names {items[0].split(':')[0]} more than once" in err and "(5,001 in all)" in err, err


def test_a_file_whose_name_holds_commas_is_one_item_of_a_list_of_files(tmp_path, monkeypatch):
    """Where the items are files (lm-eval's task files, prepare_openwebtext.py's inputs), commas
    inside a name that exists stay in it, alone, among others, in a folder's name too; a name
    that does not exist splits as before."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my,task.yaml").write_text("task: mine\n")
    (tmp_path / "d,1").mkdir()
    (tmp_path / "d,1" / "t,2,3.yaml").write_text("task: deep\n")
    (tmp_path / "my").write_text("a file named my\n")  # (the longer name that exists wins)
    cases = {"my,task.yaml": ["my,task.yaml"],
             "lambada,my,task.yaml,wikitext": ["lambada", "my,task.yaml", "wikitext"],
             " d,1/t,2,3.yaml ,my": ["d,1/t,2,3.yaml", "my"],
             "no,such.yaml": ["no", "such.yaml"],
             "my,other": ["my", "other"]}
    for text, items in cases.items():
        assert cli.parse_list("harness", text, paths=True) == items, text
        assert cli.parse_list("harness", text) == [p.strip() for p in text.split(",")], text  # (names alone: commas)
    with pytest.raises(cli.ConfigError, match="names my,task.yaml more than once"):
        cli.parse_list("harness", "my,task.yaml,./x,my,task.yaml", paths=True)


def test_evaluate_and_prepare_openwebtext_take_a_file_with_commas_alone(tmp_path, monkeypatch):
    """The two scripts whose lists name files, as a user runs them: the file is one task, one input."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    import evaluate
    import prepare_openwebtext
    from nanotost import lm_eval_adapter
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my,task.yaml").write_text("task: mine\n")
    (tmp_path / "a,book.txt").write_text("a book\n")
    asked = []

    class Stop(Exception):
        pass

    def run_tasks(lm, specs, limit):  # (what lm-eval would be asked to run; nothing runs)
        asked.append(specs)
        raise Stop()
    monkeypatch.setattr(lm_eval_adapter, "NanoToSTLM", lambda **kwargs: None)
    monkeypatch.setattr(lm_eval_adapter, "run_tasks", run_tasks)
    with pytest.raises(Stop):
        evaluate.main(["--harness=my,task.yaml", "--device=cpu"])
    assert asked == [["my,task.yaml"]]
    assert prepare_openwebtext.input_files("a,book.txt")[0] == ["a,book.txt"]


def test_the_rules_checks_grow_with_the_list_not_with_its_square(monkeypatch):
    """Each item is compared a bounded number of times (counted, not timed): items given twice are
    counted once each, the folders of path items listed once."""
    comparisons = [0]

    class Item(str):
        def __eq__(self, other):
            comparisons[0] += 1
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    for n in (1000, 4000):
        comparisons[0] = 0
        cli.parse_list("names", ",".join(f"n{i}" for i in range(n)), item=Item)
        assert comparisons[0] <= 4 * n, (n, comparisons[0])  # (each with every other: n * n / 2)
    listed = []
    real = os.listdir

    def listdir(folder="."):
        listed.append(folder)
        return real(folder)
    monkeypatch.setattr(os, "listdir", listdir)
    cli.parse_list("files", ",".join(f"f{i}.txt" for i in range(2000)), paths=True)
    assert len(listed) == 1, listed
