"""
Issue 33: nothing lost, nothing silently wrong, in the newest tools (bench.py --report,
results/render.py, results/compare/pydocs.py, results/recall/, lra/listops_runs.py) and a few corners of the
older scripts. One parametrized test per class of fault, over the scripts that share its
mechanism:

  1. two writers at once: every writer of a shared output claims it (outputs.claim_output) before
     any work; a second writer, a real second process, is refused in one line
  2. a document or a committed file destroyed: render.py refuses markers that do not pair up
     (rewrite and --check); results/compare/pydocs.py --calibrate writes the committed calibration only
     when named, and keeps the models it does not measure
  3. the project's own JSON cut short, missing a field, or holding a value of another type: one
     line naming the file (and the field) and what to do (atomic.read_json, atomic.reading)
  4. Ctrl-C says what was saved, and stops a section that runs in its own process group
  5. an output that cannot be written is found before the work, not after
  6. settings that cannot do what they say: a budget too short for any section, a commit that
     is not one, a name twice in a list, a JSON of another kind for --json_path
  7. lm-eval input: no task, a task YAML that does not parse
  8. text input: a NUL byte anywhere, a pipe (<(zcat book.gz))
  9. (checkpoints that are not dicts: tests/test_error_classes.py, class 7) local files prepared
     under a Hugging Face cache that cannot be written
 10. every test that signals a child starts it with the signals' defaults (helpers_signals)

Mostly in this process through cli.run_cli; real processes where two processes are the point.

    python -m pytest -q tests/test_tool_errors.py
"""

import contextlib
import importlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from results.benchkit import meta as bench_meta  # noqa: E402
from results.benchkit import report as bench_report  # noqa: E402
from results.compare import pydocs  # noqa: E402
from helpers_signals import default_signals  # noqa: E402
from lra import listops_runs  # noqa: E402
from results.recall import suite  # noqa: E402
from results import render  # noqa: E402
from nanotost import atomic, cli, outputs
from nanotost import textdata as td  # noqa: E402
from test_errors import call, data, refused  # noqa: E402,F401  (data: a fixture)
from test_train import TIKTOKEN_CACHE, needs_bpe  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog. " * 40
HOLDER = "import sys; from nanotost import outputs; outputs.claim_output(sys.argv[1], 'x'); print('held', flush=True); sys.stdin.read()"


def python(*argv, **kwargs):
    """A real process of the repository's Python, with the signals' defaults."""
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals, **kwargs)


@contextlib.contextmanager
def held(path):
    """Another process holding the claim of `path`, as a running writer does."""
    proc = python("-c", HOLDER, str(path), cwd=REPO, stdin=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "held", proc.stderr.read()
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def feed(fifo, text, reading=lambda: True):
    """Write text into the pipe `fifo` once a reader has opened it, while reading() (never a
    block on a reader that is gone)."""
    for _ in range(600):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
        except OSError:
            if not reading():
                return
            threading.Event().wait(0.1)
            continue
        os.set_blocking(fd, True)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return


# -----------------------------------------------------------------------------
# 1. two writers at once


def writers(root):
    """script -> (its arguments, the output it claims): every writer of a shared output."""
    out = root / "out"
    return {
        "bench.py": (["--out=out/b.json", "--suites=op", "--impls=torch", "--T=8", "--device=cpu"], out / "b.json"),
        "bench.py --report": (["--report=1", "--device=cpu", "--quick=1", "--out=out/r.json"], out / "r.json"),
        "prepare_char.py": ([f"--input={root / 'book.txt'}", "--name=book", "--data_dir=out"], out / "book"),
        "prepare_openwebtext.py": ([f"--input={root / 'book.txt'}", "--name=owt", "--data_dir=out"], out / "owt"),
        "results/compare/pydocs.py": ([f"--data_dir={root / 'data'}", "--dataset=tiny_char", f"--out_root={out / 'root'}",
                               "--conditions=iters", f"--out={out / 'p.json'}"], out / "p.json"),
        "results/recall/suite.py": (["--quick=True", "--out_json=out/q.json", "--figure=out/q.png"], out / "q.json"),
        "results/recall/decode_bench.py": (["--out=out/d.json"], out / "d.json"),
        "lra/listops_runs.py": ([f"--out={out / 'l.json'}", "--grids=tiny"], out / "l.json"),
        "lra/generate.py": (["--task=listops", "--out_dir=out/gen"], out / "gen"),
        "results/render.py": ([f"--root={root / 'docs'}"], root / "docs" / "README.md"),
    }


def docs_copy(where):
    """The documents and the JSON of their tables under `where`, a table of README.md stale."""
    tables, _, figures = render.registry()
    for rel in list(render.DOCS) + sorted({path for _, path, _ in tables.values()}) + sorted(figures):
        if os.path.isfile(os.path.join(REPO, rel)):
            os.makedirs(os.path.dirname(os.path.join(where, rel)), exist_ok=True)
            shutil.copy(os.path.join(REPO, rel), os.path.join(where, rel))
    readme = os.path.join(where, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text.replace("<!-- table: pydocs_compare -->\n", "<!-- table: pydocs_compare -->\nstale\n"))


WRITERS = sorted(writers(pathlib.PurePath("/root")))  # (the names only)


@pytest.mark.parametrize("member", WRITERS)
def test_a_second_writer_of_one_output_is_refused_before_any_work(member, data):
    (data / "book.txt").write_text(TEXT)
    docs_copy(str(data / "docs"))
    argv, claimed = writers(data)[member]
    script = member.split()[0]
    with held(claimed):
        message = refused(script, *argv, root=data, contains=["is in use by another run"])
    assert str(claimed).endswith(message.split(": ", 1)[1].split(" is in use")[0])


def test_two_preparations_under_one_name_at_once_one_is_refused(tmp_path, monkeypatch):
    """The issue's case: a prepare_char.py (a process of its own) claims data/book and waits on
    its pipe; a second one (in this process), another input under the same name, is refused;
    the first then prepares."""
    fifo, other = tmp_path / "book.fifo", tmp_path / "other.txt"
    os.mkfifo(fifo)
    other.write_text(TEXT.upper())
    first = python(os.path.join(REPO, "prepare_char.py"), f"--input={fifo}", "--name=book", cwd=tmp_path)
    try:
        lock = tmp_path / "data" / ".book.lock"
        for _ in range(600):  # its claim is taken before it opens the pipe
            if lock.exists() or first.poll() is not None:
                break
            threading.Event().wait(0.1)
        monkeypatch.chdir(tmp_path)
        assert call("prepare_char.py", f"--input={other}", "--name=book") == (
            1, "prepare_char.py: data/book is in use by another run: wait for it to end, or write this run elsewhere "
               "with --name=<other> or --data_dir=<folder>")
        feed(fifo, TEXT, reading=lambda: first.poll() is None)
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0 and out.startswith("prepared data/book"), err
    meta = json.loads((tmp_path / "data" / "book" / "meta.json").read_text())
    assert meta["source"]["stream"] == str(fifo) and meta["splits"] == {"train": 1620, "val": 180}
    assert sorted(os.listdir(tmp_path / "data")) == ["book"]  # no lock, no temp folder left


# -----------------------------------------------------------------------------
# 2. documents and committed files


def cut_marker(text, which):
    closing = [m.start() for m in re.finditer("<!-- /table -->", text)]
    at = {"first": closing[0], "last": closing[-1]}[which]
    return text[:at] + text[at + len("<!-- /table -->"):]


DAMAGES = {  # doc -> what is done to it, what the refusal says
    "README.md, first closing marker deleted": ("README.md", lambda t: cut_marker(t, "first"),
                                                "has no <!-- /table --> before the next table"),
    "lra/README.md, last closing marker deleted": ("lra/README.md", lambda t: cut_marker(t, "last"),
                                                   "has no <!-- /table --> after it"),
    "SPEED.md, an opening marker deleted": ("SPEED.md", lambda t: re.sub(r"<!-- table: [\w.-]+ -->\n", "", t, 1),
                                            "closes no table"),
    "results/recall/README.md, a marker misspelt": ("results/recall/README.md",
                                            lambda t: t.replace("<!-- /table -->", "<!--/table-->", 1),
                                            "is not a table marker"),
}


@pytest.mark.parametrize("mode", ["rewrite", "--check"])
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_document_whose_markers_do_not_pair_up_is_refused_and_left_as_it_is(damage, mode, tmp_path):
    docs_copy(str(tmp_path))
    doc, change, words = DAMAGES[damage]
    path = tmp_path / doc
    path.write_text(change(path.read_text()))
    before = {d: (tmp_path / d).read_bytes() for d in render.DOCS}
    argv = [f"--root={tmp_path}"] + (["--check"] if mode == "--check" else [])
    message = refused("results/render.py", *argv, root=tmp_path, contains=[words, f"{doc}:"])
    assert "nothing was written" in message
    assert {d: (tmp_path / d).read_bytes() for d in render.DOCS} == before


def calibration(models, machine, iters=60):
    return dict(machine=machine, calib_iters=iters, calib_skip=10, rounds=3, loads=[], date="earlier",
                models={m: dict(s_per_iter=0.1, rounds=[0.1], recipe_id="r", recipe=[]) for m in models})


def test_calibrate_writes_the_committed_file_only_when_named_and_keeps_other_models(tmp_path, monkeypatch):
    cfg = SimpleNamespace(**{**pydocs.SETTINGS, "calibrate": True, "out_root": str(tmp_path / "root")})
    pydocs.check_settings(cfg)
    pydocs.claim_outputs(cfg, given={"calibrate"})
    assert cfg.calibration == os.path.join(str(tmp_path / "root"), "calibration.json")  # not the committed one
    cfg.calibration, cfg.names = str(tmp_path / "cal.json"), ["tost"]
    atomic.write_json(cfg.calibration, calibration(["tost", "softmax", "linear"], pydocs.machine()))
    measured = dict(tost=dict(s_per_iter=0.2, rounds=[0.2], recipe_id="r", recipe=[]))
    monkeypatch.setattr(pydocs, "calibrate_models", lambda names, cfg: (measured, []))
    pydocs.take_calibration(cfg)
    models = json.loads((tmp_path / "cal.json").read_text())["models"]
    assert models["tost"]["s_per_iter"] == 0.2 and set(models) == {"tost", "softmax", "linear"}
    atomic.write_json(cfg.calibration, calibration(["tost", "softmax"], dict(pydocs.machine(), cpu="another")))
    with pytest.raises(cli.UserError, match="softmax taken on another machine .* --calibration=<new file>"):
        pydocs.take_calibration(cfg)


# -----------------------------------------------------------------------------
# 3. the project's own JSON: cut short, a field missing, a value of another type


def committed(rel):
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return json.load(f)


def read_render(path):
    """results/render.py rendering lra/README.md's table from the JSON at path."""
    root = os.path.dirname(os.path.dirname(path))
    tables, awaited, _ = render.registry()
    return render.render_table("lra_listops_tiny", tables, awaited, root, {})


REPORT = dict(schema=bench_report.REPORT_SCHEMA, meta=dict(slug="cpu", quick=True, name="cpu"), runs=[],
              sections={"op": dict(status="ok", rows=[dict(status="ok", ms=1.0)])})
FINISHED = {"tost_s1_i8": dict(val_loss=1.0, iters=8, share=0.5, corpus_words=1, words=2, params=10)}
JSON_READERS = {  # reader -> (file name, content, read(path), a field to delete, a field to make a string)
    "bench.py --report": ("r.json", REPORT, lambda p: bench_report.load_report(p, REPORT["meta"]), ["runs"],
                          ["sections", "op", "rows"]),
    "results/render.py": ("lra/results_listops.json", committed("lra/results_listops.json"), read_render,
                          ["grids", "tiny", "runs"], ["grids", "tiny", "runs", 0, "test_acc_at_best_val"]),
    "results/compare/pydocs.py calibration": ("cal.json", committed("results/compare/pydocs_calibration.json"),
                                      lambda p: pydocs.read_calibration(SimpleNamespace(calibration=p)),
                                      ["models", "tost", "s_per_iter"], ["models", "tost", "s_per_iter"]),
    "results/compare/pydocs.py finished runs": ("results.json", FINISHED, lambda p: pydocs.run_all(
        [], SimpleNamespace(out_root=os.path.dirname(p)), set()), ["tost_s1_i8", "val_loss"], ["tost_s1_i8", "share"]),
    "results/recall/suite.py": ("q.json", committed("results/recall/results_cpu.json"),
                        lambda p: suite.load_results(SimpleNamespace(out_json=p)), ["runs", 0, "val_acc"],
                        ["runs", 0, "lr"]),
    "lra/listops_runs.py": ("l.json", committed("lra/results_listops.json"),
                            lambda p: listops_runs.read_results(p, SimpleNamespace(out=p)),
                            ["grids", "tiny", "runs", 0, "seed"], ["grids", "tiny", "runs", 0, "params"]),
}


def at(obj, keys):
    for k in keys[:-1]:
        obj = obj[k]
    return obj, keys[-1]


@pytest.mark.parametrize("damage", ["cut short", "a field missing", "a string for a number", "another kind"])
@pytest.mark.parametrize("reader", sorted(JSON_READERS))
def test_the_projects_json_damaged_is_one_line_naming_the_file_and_field(reader, damage, tmp_path):
    name, content, read, missing, wrong = JSON_READERS[reader]
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = json.loads(json.dumps(content))
    path.write_text(json.dumps(obj))
    read(str(path))  # undamaged: read without complaint
    text = json.dumps(obj, indent=1)
    if damage == "cut short":
        text = text[:len(text) // 2]
    elif damage == "another kind":
        text = "[1, 2, 3]"
    else:
        where, key = at(obj, missing if damage == "a field missing" else wrong)
        if damage == "a field missing":
            del where[key]
        else:
            where[key] = "1.0x"
        text = json.dumps(obj)
    path.write_text(text)
    with pytest.raises(cli.UserError) as e:
        read(str(path))
    message = str(e.value)
    assert name in message and "\n" not in message and "Traceback" not in message, message
    if damage == "a field missing" and isinstance(missing[-1], str):
        assert repr(missing[-1]) in message or missing[-1] in message, message
    assert re.search(r"restore|run|move it away|choose another|measure|write it again|give --", message), message


# -----------------------------------------------------------------------------
# 4. Ctrl-C


@pytest.fixture(scope="module")
def interrupted_report(tmp_path_factory):
    """bench.py --report with `decode` hung in its own process group: a second report into the
    same --out meanwhile, then Ctrl-C (SIGINT to bench.py alone, as the terminal's group)."""
    tmp = tmp_path_factory.mktemp("interrupted")
    out = tmp / "r.json"
    argv = [os.path.join(REPO, "bench.py"), "--report", "--device=cpu", "--quick",
            "--sections=gpu_check_accuracy,decode", f"--out={out}"]
    first = python(*argv, cwd=tmp, env=dict(os.environ, NANOTOST_BENCH_HANG="decode", PYTHONUNBUFFERED="1"))
    try:
        printed = []
        for line in first.stdout:
            printed.append(line)
            if "hanging (NANOTOST_BENCH_HANG)" in line:
                break
        with pytest.MonkeyPatch.context() as mp:  # the second, in this process
            mp.chdir(tmp)
            second = call("bench.py", *argv[1:])
        first.send_signal(signal.SIGINT)
        rest, err = first.communicate(timeout=60)  # not waiting on the hung section
    finally:
        first.kill()
    return dict(out=out, code=first.returncode, err=err, printed="".join(printed) + rest, second=second)


def test_a_second_report_into_the_same_file_is_refused(interrupted_report):
    assert interrupted_report["second"] == (1, f"bench.py: {interrupted_report['out']} is in use by another run: "
                                               "wait for it to end, or write this run elsewhere with --out=<another file>")


def fake_listops(monkeypatch, outcomes):
    monkeypatch.setattr(listops_runs, "prepare_data", lambda grid, cfg: dict(dir="d"))
    monkeypatch.setattr(listops_runs, "capability", lambda path: "AVX2")
    record = dict(test_acc_at_best_val=50.0, best_val_acc=50.0, wall_s=1.0, load_average_before=[0.0])
    monkeypatch.setattr(listops_runs, "one_run", lambda *a: next(outcomes)(record))


def fake_recall(monkeypatch, outcomes):
    def run_job(job, cfg):
        return next(outcomes)((job, dict(job._asdict(), acc={"16": 0.5}, steps=1, train_s=0.0, val_acc=0.5)))
    monkeypatch.setattr(suite, "run_job", run_job)


def fake_pydocs(monkeypatch, outcomes):
    row = dict(FINISHED["tost_s1_i8"], train_wall_s=1.0)
    monkeypatch.setattr(pydocs, "train_and_score", lambda *a: next(outcomes)(dict(row)))


INTERRUPTED = {  # script -> (its arguments under root, the fake that does its runs, what holds the runs)
    "lra/listops_runs.py": (lambda r: [f"--out={r}/l.json", "--grids=tiny", "--runs=shared_tssa", "--seeds=1,2,3",
                                       "--vector_paths=native"], fake_listops, "l.json holds the 1 run(s) that ended"),
    "results/recall/suite.py": (lambda r: ["--quick=True", f"--out_json={r}/q.json", "--figure="], fake_recall,
                        "the runs that ended are in"),
    "results/compare/pydocs.py": (lambda r: [f"--data_dir={r}/data", "--dataset=tiny_char", f"--out_root={r}/root",
                                     "--conditions=iters", "--models=tost", "--seeds=1,2,3"], fake_pydocs,
                          "the finished runs are in"),
}


def interrupt(_):
    raise KeyboardInterrupt


INTERRUPTS = [(script, after) for script in sorted(INTERRUPTED) for after in (0, 1)] + [("bench.py --report", 1)]


@pytest.mark.parametrize("script, after", INTERRUPTS)
def test_an_interrupt_says_what_was_saved(script, after, data, interrupted_report, monkeypatch, capsys):
    """`after` runs (or sections) end, then Ctrl-C: the line names what holds them, or says that
    nothing was saved; the report's hung section (its own process group) is stopped, not waited on."""
    if script == "bench.py --report":  # a real process: one section saved, the next hung
        report = interrupted_report
        assert report["code"] == 130 and report["err"].strip() == (
            f"bench.py: interrupted; {report['out']} holds every row measured so far; the same command runs what "
            "is missing"), report["err"]
        sections = json.loads(report["out"].read_text())["sections"]
        assert sections["gpu_check_accuracy"]["status"] == "skipped" and sections["decode"]["status"] == "interrupted"
        return
    argv, fake, saved = INTERRUPTED[script]
    fake(monkeypatch, iter([lambda r: r] * after + [interrupt]))
    code, _ = call(script, *argv(data), monkeypatch=monkeypatch)
    err = capsys.readouterr().err.strip()
    assert code == 130 and "\n" not in err and err.startswith(f"{script}: interrupted; "), err
    assert (saved in err) if after else err.endswith("nothing was saved"), err


# -----------------------------------------------------------------------------
# 5. an output that cannot be written, found before the work


def no_work(*args, **kwargs):
    raise AssertionError("the work began before the output was checked")


LATE = {  # script -> (arguments, where the work begins)
    "bench.py --report": (["--report=1", "--device=cpu", "--quick=1"], (bench_report, "run_child")),
    "results/recall/suite.py": (["--quick=True"], (suite, "run_job")),
    "results/recall/decode_bench.py": ([], ("results.recall.decode_bench", "measure")),
    "results/compare/pydocs.py": (["--data_dir=DATA/data", "--dataset=tiny_char", "--out_root=DATA/out-compare/pydocs",
                           "--conditions=iters"], (pydocs, "train_and_score")),
    "lra/listops_runs.py": (["--out=DATA/out-lra/l.json"], (listops_runs, "prepare_data")),
}


@pytest.mark.parametrize("script", sorted(LATE))
def test_an_output_that_cannot_be_written_is_refused_before_the_work(script, data, monkeypatch):
    argv, (module, work) = LATE[script]
    monkeypatch.setattr(importlib.import_module(module) if isinstance(module, str) else module, work, no_work)
    for folder in ("out-bench", "out-recall", "out-compare", "out-lra"):
        (data / folder).write_text("a file where the tool's output folder would be")
    argv = [a.replace("DATA", str(data)) for a in argv]
    refused(script.split()[0], *argv, root=data, contains=["out-"])


# -----------------------------------------------------------------------------
# 6. settings that cannot do what they say


HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
SETTINGS = {  # name -> (script, arguments, environment, what the refusal says)
    "budget_s too short for a section": ("bench.py", ["--report=1", "--budget_s=30"], {}, "too short"),
    "section_s infinite": ("bench.py", ["--report=1", "--section_s=op:inf"], {}, "section_s must be seconds"),
    "NANOTOST_COMMIT unexpanded": ("bench.py", ["--report=1"], {"NANOTOST_COMMIT": "$(git rev-parse HEAD)"},
                                   "is not a commit"),
    "NANOTOST_COMMIT short": ("bench.py", ["--report=1"], {"NANOTOST_COMMIT": HEAD[:10]}, "is not a commit"),
    "bench.py --sections twice": ("bench.py", ["--report=1", "--sections=op,op"], {}, "more than once"),
    "bench.py --T twice": ("bench.py", ["--T=8,8"], {}, "T names 8 more than once"),
    "lra/listops_runs.py --runs twice": ("lra/listops_runs.py", ["--runs=shared_tssa,shared_tssa"], {},
                                         "runs names shared_tssa more than once"),
    "results/compare/pydocs.py --models twice": ("results/compare/pydocs.py", ["--models=tost,tost"], {}, "more than once"),
    "evaluate.py --harness twice": ("evaluate.py", ["--harness=wikitext,wikitext"], {}, "more than once"),
    "render.py --json_path of another kind": ("results/render.py", ["--show=gpu_*", "--json_path=REPO/lra/"
                                              "results_listops.json"], {}, "it is not a report of python bench.py"),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_a_setting_that_cannot_do_what_it_says_is_refused_before_any_work(case, tmp_path, monkeypatch):
    script, argv, env, words = SETTINGS[case]
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    refused(script, *[a.replace("REPO", REPO) for a in argv], root=tmp_path, contains=[words])


def test_a_budget_spent_before_any_section_is_an_error_not_advice_to_run_again(tmp_path, monkeypatch):
    """meta took longer than budget_s leaves for a section: exit 1 saying so (the same command
    would do the same), not "not complete: the same command runs what is missing"."""
    meta = bench_meta.collect_meta(SimpleNamespace(device="cpu", dtype="float32", quick=True, headline=False))
    clock = iter(range(0, 10 ** 6, 50))  # each reading of the clock 50 s later: meta "takes" the budget
    monkeypatch.setattr(bench_report, "time", SimpleNamespace(time=lambda: next(clock)))
    monkeypatch.setattr(bench_report, "run_child", lambda ctx, name, fn, cfg, tmp, limit, previous=None, on_rows=None:
                        dict(section=name, status="ok", rows=[], meta=meta, wall_s=100.0))
    monkeypatch.chdir(tmp_path)
    code, message = call("bench.py", "--report=1", "--device=cpu", "--quick=1", "--budget_s=90", "--out=r.json")
    assert code == 1 and message.startswith("bench.py: budget_s=90 was spent before any section could start"), message
    sections = json.loads((tmp_path / "r.json").read_text())["sections"]
    assert {s["status"] for name, s in sections.items() if name != "meta"} == {"not_run"}  # and said so in the JSON


def test_the_commit_git_knows_is_recorded(monkeypatch):
    monkeypatch.setenv("NANOTOST_COMMIT", HEAD.upper())
    assert bench_meta.given_commit() == HEAD


# -----------------------------------------------------------------------------
# 7. lm-eval input


YAML = {"no task": None, "a flow list not closed": "task: t\ndataset_path: [unclosed\n  x: y\n",
        "a tab for indentation": "task: t\n\tdataset_path: x\n"}


@pytest.mark.parametrize("case", sorted(YAML))
def test_lm_eval_input_that_cannot_run_is_one_line(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if YAML[case] is None:  # before any import of lm-eval
        refused("evaluate.py", "--harness=,", root=tmp_path, contains=["harness must be names separated by commas"])
        return
    pytest.importorskip("lm_eval", reason="lm-eval is not installed")
    from nanotost import lm_eval_adapter
    (tmp_path / "bad.yaml").write_text(YAML[case])
    with pytest.raises(cli.UserError, match=r"bad\.yaml:\d+: not YAML .*: correct the task file"):
        lm_eval_adapter.load_tasks([str(tmp_path / "bad.yaml")])


# -----------------------------------------------------------------------------
# 8. text input


NUL_INPUTS = {"prepare_char.py txt": "book.txt", "prepare_openwebtext.py txt": "book.txt",
              "prepare_openwebtext.py jsonl": "book.jsonl"}


@pytest.mark.parametrize("member", sorted(NUL_INPUTS))
def test_a_nul_byte_past_the_head_is_refused_naming_its_line(member, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = NUL_INPUTS[member]
    line = json.dumps({"text": "plain words"}) + "\n" if name.endswith(".jsonl") else "plain words\n"
    n = (1 << 16) // len(line) + 10  # lines: the NUL byte lies past the 64 KB check_text_file looks at
    (tmp_path / name).write_bytes((line * n).encode() + b"\x00" + line.encode())
    refused(member.split()[0], f"--input={name}", "--name=book", root=tmp_path,
            contains=[f"{name}:{n + 1} (byte {len(line) * n}) holds NUL bytes"])


def test_a_pipe_is_read_once_and_identified_by_its_content(tmp_path, monkeypatch, capsys):
    """--input=<(zcat book.gz): read once into a temp copy; the same text again is already prepared."""
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "book.fifo"
    for expected in ("prepared data/book", "data/book is already prepared"):
        os.mkfifo(fifo)
        done = threading.Event()
        writer = threading.Thread(target=feed, args=(fifo, TEXT, lambda: not done.is_set()))
        writer.start()
        code = call("prepare_char.py", f"--input={fifo}", "--name=book")[0]
        done.set()
        writer.join()
        assert code == 0
        fifo.unlink()
        assert capsys.readouterr().out.startswith(expected)
    source = json.loads((tmp_path / "data" / "book" / "meta.json").read_text())["source"]
    assert source["stream"] == str(fifo) and source["bytes"] == len(TEXT) and len(source["sha256"]) == 64
    assert not any(td.is_stream(p) and os.path.exists(p) for p in list(td._streams))  # the copies went


# -----------------------------------------------------------------------------
# 9. local files need no Hugging Face cache


@needs_bpe
def test_local_files_are_prepared_under_a_datasets_cache_that_cannot_be_written(tmp_path, monkeypatch):
    import datasets

    (tmp_path / "afile").write_text("a file where the cache folder would be")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "afile" / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "afile" / "hf"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", os.path.abspath(TIKTOKEN_CACHE))
    (tmp_path / "a.txt").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    assert call("prepare_openwebtext.py", "--input=a.txt", "--num_proc=1")[0] == 0
    assert sorted(os.listdir(tmp_path / "data")) == ["a"]  # its temp cache went with the run
    assert sorted(os.listdir(tmp_path / "data" / "a")) == [outputs.MANIFEST, "meta.json", "train.bin", "val.bin"]


# -----------------------------------------------------------------------------
# 10. tests that signal a child give it the signals' defaults


def signalling_tests():
    found = []
    for folder in ("tests", "lra", "."):
        for name in sorted(os.listdir(os.path.join(REPO, folder))):
            if name.startswith("test_") and name.endswith(".py"):
                with open(os.path.join(REPO, folder, name), encoding="utf-8") as f:
                    text = f.read()
                if re.search(r"send_signal\(|os\.kill\(|killpg\(", text) and re.search(r"SIG(INT|TERM)\b", text):
                    found.append(os.path.normpath(os.path.join(folder, name)))
    return found


def popen_calls(text):
    """The text of every call that starts a child a test may signal (subprocess.Popen,
    background.start), from its name to its closing parenthesis."""
    calls = []
    for m in re.finditer(r"subprocess\.Popen\(|background\.start\(", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        calls.append(text[m.start():i])
    return calls


@pytest.mark.parametrize("path", signalling_tests())
def test_every_child_a_test_signals_starts_with_the_signals_defaults(path):
    """A test that sends SIGINT or SIGTERM starts each child with preexec_fn=default_signals: a
    background job's ignored SIGINT (./run-tests.sh &) must not reach the child."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        calls = popen_calls(f.read())
    assert calls, path
    for text in calls:  # (background.start gives every job the defaults itself)
        assert "preexec_fn=default_signals" in text or text.startswith("background.start("), (path, text)


def test_the_signalling_tests_are_found():
    assert {"tests/test_errors.py", "tests/test_vit_errors.py", "tests/test_tool_errors.py"} <= set(signalling_tests())
