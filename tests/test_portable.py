"""
Every script on Linux, macOS and Windows (issue 45, item 4). The tests run on Linux; what
Windows and macOS lack is taken away by tests/foreign_os (fcntl unimportable, renameat2 hidden,
msvcrt's lock in place of flock, no fchmod, fchown, setsid, killpg or getloadavg), and:

  * train.py, sample.py, evaluate.py, prepare_char.py and lm_inspect.py run their CPU path end
    to end under it (a dataset and an inspection written twice: the second swap is two renames);
  * two writers of one output (a run's out_dir, a dataset, an inspection) are still refused;
  * the OS's own calls (locks, renameat2, process groups, fork hooks, load averages, the POSIX
    signals) are made only in portable.py, or where guarded for the systems that lack them.

    python -m pytest -q tests/test_portable.py
"""

import ast
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM = os.path.join(REPO, "tests", "foreign_os")
sys.path.insert(0, REPO)

from nanotost import cli, outputs  # noqa: E402

# runs scripts as the command line does (cli.run_cli, sys.argv[0] the script), in one process
# under the shim: [[script, argv], ...] -> [[exit code, stderr's last line], ...] as JSON. The
# step "hold" starts another process (under the shim too) holding the claims of its argv: a
# run's out_dir, a dataset, an inspection; "release" ends it.
DRIVER = r"""
import contextlib, importlib, io, json, os, subprocess, sys
sys.path.insert(0, os.getcwd())
from nanotost import cli, portable
assert portable.fcntl is None and portable._renameat2() is None and not hasattr(os, "fchmod")  # the shim holds
HOLDER = ("import sys\nfrom nanotost import cli, outputs\ncli.run_cli(lambda: (outputs.claim_output(sys.argv[1], 'x', folder=True), "
          "outputs.claim_set(sys.argv[2], 'x', 'a preparation'), outputs.claim_set(sys.argv[3], 'x', 'lm_inspect.py'), "
          "print('held', flush=True), sys.stdin.read()))")
results = []
for script, argv in json.loads(sys.argv[1]):
    if script == "hold":
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        results.append([0, holder.stdout.readline().strip()])
        continue
    if script == "release":
        holder.stdin.close()
        results.append([holder.wait(), ""])
        continue
    sys.argv = [script] + argv
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.run_cli(importlib.import_module(script[:-3]).main, argv)
        code = 0
    except SystemExit as e:
        code, text = (1, e.code) if isinstance(e.code, str) else (e.code, "")
        err.write(text or "")
    results.append([code, (err.getvalue().strip().splitlines() or [""])[-1]])
print(json.dumps(results))
"""
TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2", "--eval_iters=1",
        "--device=cpu", "--dtype=float32", "--compile=False", "--num_threads=1"]


def foreign_env():
    return dict(os.environ, PYTHONPATH=SHIM, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The CPU path of the five scripts under the shim, then three of them again while another
    process holds what they write: (root, {step: [exit code, stderr's last line]}, listings
    of the outputs while held)."""
    root = tmp_path_factory.mktemp("foreign")
    (root / "book.txt").write_text("Return the value of x. If 3 items are given, add them!\n" * 60)
    data, out, page = root / "data", root / "out", root / "page"
    prepare = ["prepare_char.py", [f"--input={root / 'book.txt'}", f"--data_dir={data}", "--name=book"]]
    train = ["train.py", TINY + [f"--data_dir={data}", "--dataset=book", f"--out_dir={out}", "--max_iters=2",
                                 "--eval_interval=2"]]
    inspect = ["lm_inspect.py", [f"--out_dir={out}", f"--data_dir={data}", f"--page_dir={page}", "--text=Return x",
                                 "--n_windows=1", "--batch_size=1", "--num_threads=1"]]
    steps = {"prepare": prepare, "prepare again": [prepare[0], prepare[1] + ["--force"]], "train": train,
             "sample": ["sample.py", [f"--out_dir={out}", "--start=Return", "--max_new_tokens=8", "--num_samples=1",
                                      "--device=cpu"]],
             "evaluate": ["evaluate.py", [f"--out_dir={out}", f"--data_dir={data}", "--device=cpu"]],
             "inspect": inspect, "inspect again": inspect,
             "hold": ["hold", [str(out), str(data / "book"), str(page)]],
             "prepare while held": [prepare[0], prepare[1] + ["--force"]],
             "train while held": [train[0], train[1] + ["--init_from=resume", "--max_iters=4"]],
             "inspect while held": inspect, "release": ["release", []]}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(list(steps.values()))], cwd=REPO,
                          env=foreign_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, dict(zip(steps, json.loads(done.stdout.strip().splitlines()[-1])))


def test_the_five_scripts_run_their_cpu_path_without_fcntl_and_renameat2(written):
    root, results = written
    chain = ("prepare", "prepare again", "train", "sample", "evaluate", "inspect", "inspect again")
    assert [results[step][0] for step in chain] == [0] * len(chain), results
    assert sorted(os.listdir(root / "data" / "book")) == [outputs.MANIFEST, "meta.json", "train.bin", "val.bin"]
    assert {"ckpt.pt", "eval.jsonl"} <= set(os.listdir(root / "out"))
    assert sorted(os.listdir(root / "page")) == [outputs.MANIFEST, "index.html", "inspect.json", "pi_tokens.png",
                                                 "rvar.png"]
    assert sorted(os.listdir(root)) == ["book.txt", "data", "out", "page"]  # no lock, no temporary folder left


def test_two_writers_of_one_output_are_refused_without_fcntl(written):
    """Another process (under the shim too) holds a run's out_dir, a dataset and an inspection:
    the scripts that would write them are refused in one line."""
    root, results = written
    assert results["hold"] == [0, "held"] and results["release"] == [0, ""]
    for step, folder in (("prepare while held", root / "data" / "book"), ("train while held", root / "out"),
                         ("inspect while held", root / "page")):
        code, line = results[step]
        assert code == 1 and line.endswith(f"{folder} is in use by another run: wait for it to end, or write this "
                                           "run elsewhere with " + line.rsplit(" with ", 1)[-1]), (step, line)
    iters = [json.loads(line)["iter"] for line in open(root / "out" / "log.jsonl") if '"iter"' in line]
    assert max(iters) < 4  # (the refused resume trained nothing)


# the OS's own calls, and where each may be made: portable.py, or (guarded) the one place named
PORTABLE = {"nanotost/portable.py"}
OWN_CALLS = {"fcntl": PORTABLE, "msvcrt": PORTABLE, "renameat2": PORTABLE, "setsid": PORTABLE, "killpg": PORTABLE,
             "getloadavg": PORTABLE, "SIGKILL": PORTABLE, "kill": PORTABLE, "ismount": PORTABLE, "pathconf": PORTABLE,
             "SIGHUP": set(), "SIGALRM": set(), "SIGUSR1": set(), "SIGUSR2": set(), "fork": set(), "preexec_fn": set(),
             "start_new_session": set(), "prctl": set(), "geteuid": set(), "register_at_fork": {"nanotost/ranks.py"},
             "fchmod": {"nanotost/atomic.py"}, "fchown": {"nanotost/atomic.py"},
             "sched_getaffinity": {"nanotost/devices.py"}, "getuid": {"kernels/cpu.py"}}


def project_files():
    """The project's own Python files (the tests, which run on Linux, aside)."""
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and d not in ("tests", "out", "data")]
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), REPO)
            if name.endswith(".py") and not name.startswith("test_"):
                yield rel


def own_calls(path):
    """The names of OWN_CALLS a file uses: os.<name>, signal.<name>, imports, keyword arguments."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in OWN_CALLS:
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if node.attr not in ("kill", "fork", "ismount", "pathconf") or getattr(root, "id", "") == "os":
                found.add(node.attr)  # (a Process's .kill() is no os.kill)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in OWN_CALLS}
        elif isinstance(node, ast.keyword) and node.arg in OWN_CALLS:
            found.add(node.arg)
        elif isinstance(node, ast.Constant) and node.value in ("renameat2", "register_at_fork", "fchmod", "fchown",
                                                               "getuid"):
            found.add(node.value)
    return found


def test_the_oss_own_calls_are_made_only_behind_a_portable_path():
    """Each call of the OS's own (flock, renameat2, setsid, killpg, SIGKILL, os.kill, ...) is in
    portable.py, or in the one file named for it, where it is guarded (hasattr, or the error of
    a system that lacks it). A new one elsewhere is a script that fails on Windows or macOS."""
    places = {}
    for path in project_files():
        for name in own_calls(path):
            places.setdefault(name, set()).add(path.replace(os.sep, "/"))
    stray = {name: sorted(files - OWN_CALLS[name]) for name, files in places.items() if files - OWN_CALLS[name]}
    assert not stray, f"OS-specific calls outside portable.py: {stray}"
    assert places["fcntl"] == PORTABLE and "renameat2" in places  # (the check finds what it looks for)
