"""
What the project writes is one unit, and keeps what the user set on it (issue 40):

  * a set of outputs (outputs.claim_set / OutputSet: lm_inspect.py's page, vit_inspect.py's
    pictures): claimed before any work, replaced whole by one swap of folders; each fault
    (another run, an interrupt, a full disk, a folder that cannot be written, a folder of
    someone else's files) leaves the earlier set whole and says so in one line;
  * files that are one unit but not one folder (atomic.write_together: a JSON and its figure);
  * every writer (atomic_write and what is built on it: write_json, save_checkpoint,
    write_together, an OutputSet) keeps the replaced file's mode and group, and writes through a
    symlink instead of over it;
  * text from a user never reaches a parser as markup (a `$` in a figure's text).

The faults a root user cannot meet (permissions) are made by failing the call that meets them.

    python -m pytest -q tests/test_outputs.py
"""

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanotost import atomic, checkpoints, cli, outputs, plots  # noqa: E402
from helpers_signals import default_signals  # noqa: E402

TOOL = "inspect.py"  # who writes the sets of these tests (an OutputSet's manifest names it)
EARLIER = {"a.png": b"earlier a", "b.png": b"earlier b", "inspect.json": b'{"earlier": 1}\n'}


def recorded(files):
    """What a manifest records of files ({name: bytes}): each one's size and sha256, computed here."""
    return {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in sorted(files.items())}


MANIFEST = {outputs.MANIFEST: (json.dumps({"tool": TOOL, "files": recorded(EARLIER)}, indent=1) + "\n").encode()}


def contents(folder):
    """{name: bytes} of every entry of folder (a subfolder as None)."""
    return {n: (None if os.path.isdir(os.path.join(folder, n)) else open(os.path.join(folder, n), "rb").read())
            for n in sorted(os.listdir(folder))}


def earlier_set(tmp_path):
    """An earlier set of TOOL's, with the manifest it wrote."""
    out = tmp_path / "inspect"
    out.mkdir()
    for name, data in {**EARLIER, **MANIFEST}.items():
        (out / name).write_bytes(data)
    return str(out)


def new_set(folder):
    """{name: bytes} of a set written by an OutputSet, after checking that its manifest lists
    exactly its other files."""
    files = contents(folder)
    manifest = json.loads(files.pop(outputs.MANIFEST))
    assert manifest == {"tool": TOOL, "files": recorded(files)}
    return files


@pytest.fixture(autouse=True)
def fresh_claims():
    """Each test starts with no claim held and no interrupt text set, as a new process would."""
    cli.on_interrupt("nothing was saved")
    yield
    while cli._cleanups:
        cli._cleanups.pop()()


# -----------------------------------------------------------------------------
# a set of outputs

def test_a_new_set_replaces_the_earlier_whole(tmp_path):
    """Files of the earlier set that the new one lacks go with it; nothing else is left beside."""
    out = earlier_set(tmp_path)
    out_set = outputs.claim_set(out, "--out_dir=<x>", TOOL)
    assert out_set.replace({"a.png": b"new a", "inspect.json": "{}\n"}) is True
    assert new_set(out) == {"a.png": b"new a", "inspect.json": b"{}\n"}  # (b.png gone)
    assert sorted(os.listdir(tmp_path)) == ["inspect"]  # no temporary folder beside it, the lock released
    assert cli.left_behind() == f"{out} holds the new set, whole"


def fail_at_second_file(fault, at=2):
    """A fault met inside the second (at-th) file's write (an OSError of a write names no file)."""
    original, seen = atomic.keep_owner_and_mode, []

    def meet(fd, old):
        seen.append(old)
        if len(seen) == at:
            raise fault
        original(fd, old)
    return meet


@pytest.mark.parametrize("fault, says", [
    (KeyboardInterrupt(), None),
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded"),
    (OSError(errno.EIO, "Input/output error"), "Input/output error"),
], ids=["interrupt", "disk-full", "quota", "io-error"])
def test_a_fault_while_writing_leaves_the_earlier_set_whole(tmp_path, monkeypatch, fault, says):
    out = earlier_set(tmp_path)
    out_set = outputs.claim_set(out, "--out_dir=<x>", TOOL)
    monkeypatch.setattr(atomic, "keep_owner_and_mode", fail_at_second_file(fault))
    with pytest.raises(type(fault) if says is None else cli.UserError) as e:
        out_set.replace({"a.png": b"new a", "c.png": b"new c", "inspect.json": "{}\n"})
    assert contents(out) == {**EARLIER, **MANIFEST}
    assert sorted(os.listdir(tmp_path)) == [".inspect.lock", "inspect"]  # (still claimed: the run has not ended)
    assert cli.left_behind() == f"nothing was replaced: {out} holds its earlier files, whole"
    if says:
        assert str(e.value).count("\n") == 0 and says in str(e.value) and str(e.value).endswith(cli.left_behind())
        assert os.path.join(out, "c.png") in str(e.value)  # the file meant, not its temporary name


def test_the_swap_cannot_be_cut_by_an_interrupt(tmp_path, monkeypatch):
    """A SIGINT that arrives during the swap waits for it: the new set is whole, then the interrupt."""
    out = earlier_set(tmp_path)
    out_set = outputs.claim_set(out, "--out_dir=<x>", TOOL)
    swap = outputs.swap_folders
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, whatever pytest inherited

    def interrupted_swap(*folders):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # (were it not held, the KeyboardInterrupt would land here, before the swap)
        swap(*folders)
    monkeypatch.setattr(outputs, "swap_folders", interrupted_swap)
    try:
        with pytest.raises(KeyboardInterrupt):
            out_set.replace({"a.png": b"new a", "inspect.json": "{}\n"})
    finally:
        signal.signal(signal.SIGINT, old)
    assert new_set(out) == {"a.png": b"new a", "inspect.json": b"{}\n"}
    assert sorted(os.listdir(tmp_path)) == ["inspect"]  # the earlier set, set aside by the swap, went too


HOLDER = ("import sys; from nanotost import cli, outputs; cli.run_cli(lambda: (outputs.claim_set(sys.argv[1], 'x', sys.argv[2]), print('held', "
          "flush=True), sys.stdin.read()))")


def holding(out, tool=TOOL):
    """Another process that holds the claim of the set `out` until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, out, tool], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, preexec_fn=default_signals)
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.parametrize("case", ["holder", "file", "foreign-file", "subfolder", "folder-read-only"])
def test_a_folder_that_cannot_take_the_set_is_refused_before_any_work(tmp_path, monkeypatch, case):
    """Each in one line naming the way out; the folder as it was."""
    out = earlier_set(tmp_path)
    holder = None
    if case == "holder":  # another run holds it
        holder = holding(out)
    elif case == "file":
        out = str(tmp_path / "a-file.png")
        open(out, "w").close()
    elif case == "foreign-file":
        (tmp_path / "inspect" / "notes.txt").write_text("mine")
    elif case == "subfolder":
        (tmp_path / "inspect" / "more.png").mkdir()
    elif case == "folder-read-only":  # (and its parent: the set would go in place, so the folder's files must)
        parent_cannot_take(monkeypatch, errno.EACCES)
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda p, *a: (_ for _ in ()).throw(PermissionError(
            errno.EACCES, "Permission denied", p)) if str(p).startswith(out) and os.path.basename(p).startswith(
            ".") else real_open(p, *a))
    before = contents(tmp_path / "inspect")
    try:
        with pytest.raises((cli.UserError, OSError)) as e:
            outputs.claim_set(out, "--out_dir=<another folder>", TOOL)
    finally:
        if holder:
            holder.stdin.close()
            holder.wait(timeout=30)
    line = cli.os_error_line(e.value) if isinstance(e.value, OSError) else str(e.value)
    assert "\n" not in line and contents(tmp_path / "inspect") == before  # (no lock of this claim left)
    assert {"holder": "in use by another run", "file": "is a file, not a folder", "foreign-file": "notes.txt",
            "subfolder": "more.png", "folder-read-only": "Permission denied"}[case] in line
    if case != "folder-read-only":
        assert "--out_dir=<another folder>" in line


def parent_cannot_take(monkeypatch, how):
    """No folder can be made beside the output, or swapped with it (as root, made so): its parent
    is not writable (EACCES), is a read-only mount around a writable one (EROFS), or the output is
    a mount point of its own (EXDEV: the swap fails, after the new set was made)."""
    if how == errno.EXDEV:
        monkeypatch.setattr(outputs, "swap_folders", lambda a, b, aside: (_ for _ in ()).throw(OSError(
            how, "Invalid cross-device link", b)))
        return
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a: (_ for _ in ()).throw(OSError(
        how, os.strerror(how), p)) if ".tmp" in os.path.basename(p) else real_mkdir(p, *a))


@pytest.mark.parametrize("how", [errno.EACCES, errno.EROFS, errno.EXDEV], ids=["EACCES", "EROFS", "EXDEV"])
@pytest.mark.parametrize("fault", [None, KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")],
                         ids=["none", "interrupt", "disk-full"])
def test_a_writable_folder_in_a_read_only_parent_is_replaced_in_place(tmp_path, monkeypatch, fault, how):
    """The folder can be written, no folder beside it can be made or swapped with it: the new set
    goes in place (OutputSet.in_place), the earlier set's other files removed with it; a fault
    before the renames leaves it whole."""
    out = earlier_set(tmp_path)
    parent_cannot_take(monkeypatch, how)
    out_set = outputs.claim_set(out, "--out_dir=<x>", TOOL)
    assert out_set.in_place == (how != errno.EXDEV)
    if fault is not None:
        monkeypatch.setattr(atomic, "keep_owner_and_mode", fail_at_second_file(fault))
        with pytest.raises(type(fault) if isinstance(fault, KeyboardInterrupt) else cli.UserError):
            out_set.replace({"a.png": b"new a", "c.png": b"new c", "inspect.json": "{}\n"})
        assert contents(out) == {**EARLIER, **MANIFEST} | ({} if out_set.in_place else {})
        assert cli.left_behind() == f"nothing was replaced: {out} holds its earlier files, whole"
        return
    assert out_set.replace({"a.png": b"new a", "inspect.json": "{}\n"}) is True
    assert new_set(out) == {"a.png": b"new a", "inspect.json": b"{}\n"}  # (b.png gone)
    assert sorted(os.listdir(tmp_path)) == ["inspect"]


def test_what_a_killed_run_left_in_the_folder_is_cleared_not_refused(tmp_path):
    """A run killed (-9) while writing in place leaves .<name>.tmp<pid> files of a dead process:
    the next claim removes them (they are its own kind's debris, not the user's files)."""
    out = earlier_set(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    debris = os.path.join(out, f".a.png.tmp{int(dead.stdout)}")
    open(debris, "wb").close()
    outputs.claim_set(out, "x", TOOL).replace({"inspect.json": "{}\n"})
    assert new_set(out) == {"inspect.json": b"{}\n"}


def test_a_symlinked_folder_stays_a_symlink(tmp_path):
    target = earlier_set(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    outputs.claim_set(str(link), "--out_dir=<x>", TOOL).replace({"inspect.json": "{}\n"})
    assert os.path.islink(link) and new_set(target) == {"inspect.json": b"{}\n"}


def test_the_claim_holds_until_the_set_is_written_and_ends_with_the_run(tmp_path):
    """The lock is beside the folder (no swap carries it, no hard link is made): a second run is
    refused while the set is written and swapped, and may begin once it is; a run that wrote
    nothing leaves no folder behind."""
    out = earlier_set(tmp_path)
    out_set = outputs.claim_set(out, "x", TOOL)
    probe = ("import sys\nfrom nanotost import cli, outputs\ntry:\n    outputs.claim_set(sys.argv[1], 'x', sys.argv[2])\n"
             "except cli.UserError as e:\n    print(e)")

    def second_run():
        return subprocess.run([sys.executable, "-c", probe, out, TOOL], cwd=REPO, capture_output=True, text=True,
                              timeout=60).stdout
    swap = outputs.swap_folders
    during = []
    outputs.swap_folders = lambda *folders: (swap(*folders), during.append(second_run()))
    try:
        out_set.replace({"inspect.json": "{}\n"})
    finally:
        outputs.swap_folders = swap
    assert "in use by another run" in during[0] and second_run() == ""
    empty = str(tmp_path / "new" / "deeper")
    outputs.claim_set(empty, "x", TOOL)
    while cli._cleanups:
        cli._cleanups.pop()()
    assert not os.path.exists(tmp_path / "new")


# -----------------------------------------------------------------------------
# every writer keeps the mode, the group and the symlink of the file it replaces

def write_with(writer, path, tmp_path):
    """Replace `path` with new content through one of the project's writers."""
    if writer == "atomic_write":
        with atomic.atomic_write(path) as f:
            f.write(b"new")
    elif writer == "write_json":
        atomic.write_json(path, {"new": 1})
    elif writer == "save_checkpoint":
        checkpoints.save_checkpoint({"model": {"w": torch.zeros(2)}, "iter_num": 1}, path)
    elif writer == "write_together":
        atomic.write_together({path: b"new", str(tmp_path / "other.png"): b"other"})
    elif writer == "output_set":
        folder, name = os.path.split(path)  # (a file of an earlier set, written before manifests)
        outputs.claim_set(folder, "x", TOOL, legacy=(name,)).replace({name: b"new"})


WRITERS = ["atomic_write", "write_json", "save_checkpoint", "write_together", "output_set"]


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664, 0o600])
def test_a_replaced_file_keeps_its_mode_under_any_umask(tmp_path, writer, mode):
    folder = tmp_path / "run"
    folder.mkdir()
    path = str(folder / "ckpt.pt")
    open(path, "wb").close()
    os.chmod(path, mode)
    gid = os.stat(path).st_gid
    old = os.umask(0o077)
    try:
        write_with(writer, path, tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode and os.stat(path).st_gid == gid
    assert os.path.getsize(path) > 0  # (replaced)


@pytest.mark.parametrize("writer", [w for w in WRITERS if w != "output_set"])
def test_a_symlinked_file_stays_a_symlink_and_its_target_is_replaced(tmp_path, writer):
    """The run folder on a small disk, checkpoints on a big one: the link is the user's."""
    big = tmp_path / "big"
    big.mkdir()
    (big / "ckpt.pt").write_bytes(b"old")
    link = tmp_path / "ckpt.pt"
    link.symlink_to(big / "ckpt.pt")
    write_with(writer, str(link), tmp_path)
    assert os.path.islink(link) and (big / "ckpt.pt").read_bytes() != b"old"
    assert not [n for n in os.listdir(big) if n != "ckpt.pt"] and not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_files_written_together_are_all_replaced_or_none(tmp_path, monkeypatch):
    a, b = tmp_path / "r.json", tmp_path / "r.png"
    a.write_text("old json")
    b.write_bytes(b"old png")
    with pytest.raises(OSError):
        atomic.write_together({str(a): "new json", str(b): bytes(10), str(a / "under-a-file.png"): b""})
    assert a.read_text() == "old json" and b.read_bytes() == b"old png" and sorted(os.listdir(tmp_path)) == [
        "r.json", "r.png"]
    atomic.write_together({str(a): "new json", str(b): b"new png"})
    assert a.read_text() == "new json" and b.read_bytes() == b"new png"


@pytest.mark.parametrize("fault", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device"),
                                   OSError(errno.EIO, "Input/output error")], ids=["interrupt", "disk-full", "io"])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_a_fault_at_any_file_written_together_replaces_none(tmp_path, monkeypatch, fault, at):
    """A fault as the at-th file goes to disk (its flush: where a full disk shows): none replaced."""
    paths = [tmp_path / name for name in ("r.json", "r.png", "README.md")]
    for p in paths:
        p.write_bytes(b"old " + p.name.encode())
    monkeypatch.setattr(atomic, "keep_owner_and_mode", fail_at_second_file(fault, at))
    with pytest.raises(type(fault)) as e:
        atomic.write_together({str(p): f"new {p.name}" for p in paths})
    assert [p.read_bytes() for p in paths] == [b"old " + p.name.encode() for p in paths]
    assert sorted(os.listdir(tmp_path)) == ["README.md", "r.json", "r.png"]
    if isinstance(fault, OSError):
        assert e.value.filename == str(paths[at - 1])  # the file meant, not its temporary name


# -----------------------------------------------------------------------------
# text from a user is text: figures

@pytest.mark.parametrize("text", ["a $x^$ b", r"run $\notacommand$", "$_{$", "$$", r"costs $5\$ and $6"])
def test_a_dollar_in_any_figure_text_is_drawn_as_given(text):
    """Titles (paths, prompts), tick labels (tokens), legends: matplotlib's mathtext is off for
    every figure of the project (plots.pyplot), so none of these parses, fails or changes."""
    import numpy as np

    import lm_inspect
    import vit_inspect
    from nanotost.whitebox import rvar_figure

    rvar = {s: {"before": [1.0, 2.0], "after": [0.5, 1.5]} for s in ("train", "val")}
    assert rvar_figure(rvar, [1, 2], text, text)[:4] == b"\x89PNG"
    assert lm_inspect.pi_tokens_figure([text, "b"], [np.full((2, 2), 0.5)], [1], text)[:4] == b"\x89PNG"
    assert vit_inspect.map_figure(np.zeros((4, 4, 3)), [np.zeros((2, 2, 2))], [text], text, text, 1.0)[:4] == b"\x89PNG"
    plt = plots.pyplot()
    fig, ax = plt.subplots()
    ax.set_title(text)
    fig.canvas.draw()  # (each text above is a formula mathtext cannot parse: it would raise ValueError)
    plt.close(fig)
