"""
A tool's folder of outputs (outputs.claim_set / OutputSet) through the tools that write one
(issue 47, classes 4 and 5): lm_inspect.py --page_dir, vit_inspect.py --out_dir and
prepare_char.py's dataset folder.

  4. every precondition of the writing is known before any work: a folder that is a mount
     point (seen, or a bind mount only the swap finds) or whose parent cannot be written is
     written in place, as documented; a legal name near the file system's limit is written
     (the temporary names fit too); the lock is never a hard link; a folder whose files cannot
     be written is refused in one line before any work;
  5. a tool replaces only what its own manifest lists (or, for a set an earlier version wrote,
     what that set's own JSON lists); anything else in the folder is the user's: refused in one
     line before any work, never deleted, even a file put there while the tool works.

Mount points and folders that cannot be written are made by failing the calls that meet them
(as root, permissions cannot be); the tools run in this process through cli.run_cli.

    python -m pytest -q tests/test_output_sets.py
"""

import errno
import hashlib
import json
import os
import sys

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lm_inspect  # noqa: E402
from nanotost import cli, outputs, portable  # noqa: E402
import prepare_char  # noqa: E402
import train  # noqa: E402
import vit_inspect  # noqa: E402
import vit_train  # noqa: E402

torch.set_num_threads(1)  # tiny models on a shared machine
TOOLS = ("lm_inspect.py", "vit_inspect.py", "prepare_char.py")
MODULES = {"lm_inspect.py": lm_inspect, "vit_inspect.py": vit_inspect, "prepare_char.py": prepare_char}
TOOL_OF = {"lm_inspect.py": "lm_inspect.py", "vit_inspect.py": "vit_inspect.py", "prepare_char.py": "a preparation"}
WORK = {"lm_inspect.py": (lm_inspect, "over_windows"), "vit_inspect.py": (vit_inspect, "rvar_over"),
        "prepare_char.py": (prepare_char, "read_text")}  # the first step of each tool's work
TEXT = "Return the value of x.\nIf 3 items are given, add them: a, b and c!\n" * 40


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny language model run and a tiny ViT run to inspect, and a text to prepare."""
    root = tmp_path_factory.mktemp("sets")
    (root / "book.txt").write_text(TEXT)
    chars = "".join(sorted(set(TEXT)))
    data = root / "data" / "t_char"
    data.mkdir(parents=True)
    ids = np.array([chars.index(c) for c in TEXT], dtype=np.uint16)
    ids[:2000].tofile(data / "train.bin")
    ids[2000:].tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps(dict(dataset="t_char", tokenizer="char", vocab_size=len(chars),
                                                    chars=chars, splits={"train": 2000, "val": len(ids) - 2000},
                                                    command="python prepare_char.py --input=t.txt")))
    cli.run_cli(train.main, [f"--data_dir={root}/data", "--dataset=t_char", f"--out_dir={root}/lm", "--n_layer=1",
                             "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2", "--max_iters=1",
                             "--eval_interval=1", "--eval_iters=1", "--log_interval=100", "--warmup_iters=1",
                             "--gradient_accumulation_steps=1", "--num_threads=1", "--device=cpu", "--dtype=float32"])
    cli.run_cli(vit_train.main, ["--shapes_source_size=16", "--img_size=16", "--patch_size=8", "--n_layer=1",
                                 "--n_head=2", "--n_embd=16", "--shapes_num_classes=4", "--shapes_train_size=8",
                                 "--shapes_val_size=4", "--batch_size=4", "--device=cpu", "--dtype=float32",
                                 "--num_threads=1", f"--out_dir={root}/vit", "--max_iters=1", "--eval_interval=1"])
    return root


def argv_of(tool, root, folder):
    """The command line of `tool` writing the folder `folder` (its parent must be root's own)."""
    if tool == "lm_inspect.py":
        return [f"--out_dir={root}/lm", f"--data_dir={root}/data", f"--page_dir={folder}", "--text=a b c",
                "--n_windows=1", "--batch_size=1", "--num_threads=1"]
    if tool == "vit_inspect.py":
        return [f"--ckpt={root}/vit", f"--out_dir={folder}", "--n_show=1", "--n_rvar=2", "--batch_size=2",
                "--num_threads=1"]
    return [f"--input={root / 'book.txt'}", f"--data_dir={os.path.dirname(folder)}",
            f"--name={os.path.basename(folder)}", "--force"]  # (--force: prepared again, as the tools write again)


def call(tool, argv, capsys):
    """run_cli(main, argv) of `tool` in this process: (exit code, the stderr line)."""
    argv0, sys.argv = sys.argv, [tool]
    try:
        cli.run_cli(MODULES[tool].main, list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv0
    err = capsys.readouterr().err
    return (1, err + code) if isinstance(code, str) else (code, err)


def contents(folder):
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, n))}


def recorded(folder, names):
    """What a manifest records of the files `names` of folder: each one's size and sha256, computed here."""
    def digest(name):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return {n: digest(n) for n in sorted(names)}


def written_by(tool, folder):
    """The names of the set in folder, after checking that its manifest records exactly them, as they are."""
    files = sorted(os.listdir(folder))
    manifest = json.loads(open(os.path.join(folder, outputs.MANIFEST), encoding="utf-8").read())
    assert manifest == {"tool": TOOL_OF[tool], "files": recorded(folder, [n for n in files if n != outputs.MANIFEST])}
    return files


EARLIER = {"lm_inspect.py": ["index.html", "inspect.json", "pi_tokens.png", "rvar.png"],
           "vit_inspect.py": ["cls_attn_00.png", "cls_attn_01.png", "inspect.json", "pi_00.png", "rvar.png"],
           "prepare_char.py": ["meta.json", "test.bin", "train.bin", "val.bin"]}  # (vit, prepare: one the new lacks)


def earlier_set(tool, folder, manifest=True):
    """An earlier set of `tool` in folder, as it writes one: its files, its own JSON listing them
    (inspect.json's files, meta.json's splits), and its manifest (with manifest=True; without,
    a set an earlier version wrote)."""
    folder.mkdir()
    names = EARLIER[tool]
    for name in names:
        (folder / name).write_bytes(b"earlier " + name.encode())
    own = {"meta.json": {"splits": {"train": 4, "val": 4, "test": 4}}} if tool == "prepare_char.py" else \
        {"inspect.json": {"files": names}}
    for name, data in own.items():
        (folder / name).write_text(json.dumps(data))
    if manifest:
        (folder / outputs.MANIFEST).write_text(json.dumps({"tool": TOOL_OF[tool], "files": recorded(folder, names)}))


def no_work(monkeypatch, tool):
    module, name = WORK[tool]
    monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the work began before the refusal"))


# -----------------------------------------------------------------------------
# class 4: every precondition known before any work


def mount_point(monkeypatch, folder, seen):
    """The folder is a mount point: no rename moves it (EBUSY, or EXDEV through a hard link or a
    swap). seen: os.path.ismount sees it (the claim then writes in place from the start, and a
    swap tried anyway fails with EIO, which no fallback takes); else only the swap finds it."""
    real = os.path.realpath(folder)
    monkeypatch.setattr(portable, "is_mount_point", lambda p: seen and os.path.realpath(p) == real)
    rename = os.rename

    def no_move(src, dst, *rest):
        if real in (os.path.realpath(src), os.path.realpath(dst)):
            how = errno.EIO if seen else errno.EBUSY
            raise OSError(how, os.strerror(how), dst)
        return rename(src, dst)
    monkeypatch.setattr(os, "rename", no_move)
    monkeypatch.setattr(portable, "exchange", lambda a, b: no_move(a, b))
    monkeypatch.setattr(os, "link", lambda src, dst, **k: (_ for _ in ()).throw(OSError(
        errno.EXDEV, "Invalid cross-device link", dst)))  # (the lock is never carried by a hard link)


def parent_read_only(monkeypatch, folder):
    """No folder can be made beside it (its parent is not writable, or a read-only mount)."""
    parent, mkdir = os.path.dirname(os.path.realpath(folder)), os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a: (_ for _ in ()).throw(PermissionError(
        errno.EACCES, "Permission denied", p)) if os.path.dirname(os.path.realpath(p)) == parent and
        os.path.basename(p).startswith(".") else mkdir(p, *a))


PRECONDITIONS = {"a mount point": lambda m, f: mount_point(m, f, seen=True),
                 "a bind mount only the swap finds": lambda m, f: mount_point(m, f, seen=False),
                 "a parent that cannot be written": parent_read_only}


@pytest.mark.parametrize("case", PRECONDITIONS)
@pytest.mark.parametrize("tool", TOOLS)
def test_a_folder_no_swap_can_move_is_written_in_place(tool, case, runs, tmp_path, monkeypatch, capsys):
    """The earlier set is replaced whole, in place (its file the new set lacks goes), the tool
    exits 0, and nothing is left beside the folder."""
    folder = tmp_path / "out"
    earlier_set(tool, folder)
    PRECONDITIONS[case](monkeypatch, folder)
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    assert code == 0, err
    assert not set(written_by(tool, folder)) & {"cls_attn_01.png", "test.bin"}
    assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_legal_name_at_the_length_limit_is_written_and_written_again(tool, runs, tmp_path, capsys):
    """A folder name of 248 bytes (the file system takes 255): its lock and temporary folder
    (.<name>.tmp<pid>) would pass the limit, so they are cut, with a hash; written twice (the
    second replaces the first by a swap)."""
    room = portable.name_max(str(tmp_path))
    length = room - 7  # (248 bytes where the limit is 255)
    folder = tmp_path / ("é" * ((length - 2) // 2) + "a" * (length - 2 * ((length - 2) // 2)))
    assert len(os.fsencode(folder.name)) == room - 7
    for _ in range(2):
        code, err = call(tool, argv_of(tool, runs, folder), capsys)
        assert code == 0, err
    written_by(tool, folder)
    assert os.listdir(tmp_path) == [folder.name]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_folder_whose_files_cannot_be_written_is_refused_before_any_work(tool, runs, tmp_path, monkeypatch,
                                                                          capsys):
    """Neither a folder beside it nor a file in it can be made: one line naming the folder."""
    folder = tmp_path / "out"
    earlier_set(tool, folder)
    before = contents(folder)
    parent_read_only(monkeypatch, folder)
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a: (_ for _ in ()).throw(PermissionError(
        errno.EACCES, "Permission denied", p)) if os.path.dirname(str(p)) == str(folder) else real_open(p, *a))
    no_work(monkeypatch, tool)
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    assert code == 1 and err.count("\n") <= 1 and f"Permission denied: '{folder}'" in err, err
    assert contents(folder) == before and sorted(os.listdir(tmp_path)) == ["out"]


# -----------------------------------------------------------------------------
# class 5: only what the tool's own manifest lists is replaced


def users_files(folder, tool):
    folder.mkdir()
    (folder / "holiday.png").write_bytes(b"\x89PNG the user's")
    (folder / "notes.json").write_text('{"mine": true}')


def beside_an_earlier_set(folder, tool):
    (folder / "notes.json").write_text('{"mine": true}')


def another_tools_set(folder, tool):
    manifest = json.loads((folder / outputs.MANIFEST).read_text())
    (folder / outputs.MANIFEST).write_text(json.dumps(dict(manifest, tool="export.py")))


def an_old_set_and_a_users_file(folder, tool):
    (folder / outputs.MANIFEST).unlink()  # (a set written before manifests)
    (folder / "holiday.png").write_bytes(b"\x89PNG the user's")


def a_manifest_listing_a_users_file(folder, tool):
    """A manifest (planted, or edited) that lists a file the tool never wrote, as it lists its own."""
    (folder / "holiday.png").write_bytes(b"\x89PNG the user's")
    manifest = json.loads((folder / outputs.MANIFEST).read_text())
    manifest["files"]["holiday.png"] = {"bytes": 9, "sha256": "0" * 64}
    (folder / outputs.MANIFEST).write_text(json.dumps(manifest))


def an_old_manifest_listing_a_users_file(folder, tool):
    """An earlier version's manifest (names alone) listing a file of the user's."""
    (folder / "holiday.png").write_bytes(b"\x89PNG the user's")
    names = EARLIER[tool] + ["holiday.png"]
    (folder / outputs.MANIFEST).write_text(json.dumps({"tool": TOOL_OF[tool], "files": names}))


def a_file_of_the_set_the_user_replaced(folder, tool):
    """A file of the set's name that is no longer the one the tool wrote (the user's own, in its place)."""
    (folder / EARLIER[tool][0]).write_bytes(b"the user's own, of the same name")


def a_folder_where_a_file_of_the_set_was(folder, tool):
    (folder / EARLIER[tool][0]).unlink()
    (folder / EARLIER[tool][0]).mkdir()
    (folder / EARLIER[tool][0] / "mine.txt").write_text("mine")


REFUSED = {"the user's own files": (users_files, "holiday.png, notes.json"),
           "a user's file beside an earlier set": (beside_an_earlier_set, "notes.json"),
           "another tool's set": (another_tools_set, "holds the outputs of export.py"),
           "a set of an earlier version and a user's file": (an_old_set_and_a_users_file, "holiday.png"),
           "a manifest listing a user's file": (a_manifest_listing_a_users_file, "holiday.png"),
           "an earlier version's manifest listing a user's file": (an_old_manifest_listing_a_users_file, "holiday.png"),
           "a file of the set the user replaced": (a_file_of_the_set_the_user_replaced, None),
           "a folder where a file of the set was": (a_folder_where_a_file_of_the_set_was, None)}


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("tool", TOOLS)
def test_a_folder_holding_what_the_tool_did_not_write_is_refused_before_any_work(tool, case, runs, tmp_path,
                                                                               monkeypatch, capsys):
    folder = tmp_path / "out"
    make, words = REFUSED[case]
    if make is not users_files:
        earlier_set(tool, folder)
    make(folder, tool)
    before = contents(folder)
    no_work(monkeypatch, tool)
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    words = words or EARLIER[tool][0]  # (the file of the set's name)
    assert code == 1 and err.count("\n") <= 1 and err.startswith(f"{tool}: ") and words in err, err
    assert "write elsewhere with --" in err or "new or empty folder with --" in err, err
    assert contents(folder) == before and sorted(os.listdir(tmp_path)) == ["out"]
    assert sorted(os.listdir(folder)) == sorted(set(before) | ({EARLIER[tool][0]} if make is
                                                                a_folder_where_a_file_of_the_set_was else set()))


def a_damaged_manifest(folder, tool):
    (folder / outputs.MANIFEST).write_text('{"tool": "lm_insp')


def an_earlier_versions_manifest(folder, tool):
    (folder / outputs.MANIFEST).write_text(json.dumps({"tool": TOOL_OF[tool], "files": EARLIER[tool]}))


@pytest.mark.parametrize("make", [a_damaged_manifest, an_earlier_versions_manifest])
@pytest.mark.parametrize("tool", TOOLS)
def test_a_damaged_or_earlier_manifest_is_the_tools_own_and_its_set_is_replaced(tool, make, runs, tmp_path, capsys):
    """The manifest's name is the tool's: damaged (cut short) or of an earlier version (names,
    no digests), it is replaced with the set, whose other files are known as a set written
    before manifests is (its own JSON)."""
    folder = tmp_path / "out"
    earlier_set(tool, folder)
    make(folder, tool)
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    assert code == 0, err
    assert not set(written_by(tool, folder)) & {"cls_attn_01.png", "test.bin"}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_set_an_earlier_version_wrote_is_recognised_by_its_own_json(tool, runs, tmp_path, capsys):
    """No manifest: the files the set's own JSON lists (an inspection's inspect.json, a dataset's
    meta.json) are its files, replaced (the one the new set lacks goes); the new set has its
    manifest."""
    folder = tmp_path / "out"
    earlier_set(tool, folder, manifest=False)
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    assert code == 0, err
    assert not set(written_by(tool, folder)) & {"cls_attn_01.png", "test.bin"}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_file_put_in_the_folder_while_the_tool_works_is_kept(tool, runs, tmp_path, monkeypatch, capsys):
    """The folder is looked at again before the swap: a file that arrived is the user's, so
    nothing is replaced (one line), and both the earlier set and the file stay."""
    folder = tmp_path / "out"
    earlier_set(tool, folder)
    before = contents(folder)
    module, name = WORK[tool]
    work = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: ((folder / "late.txt").write_text("mine"), work(*a, **k))[1])
    code, err = call(tool, argv_of(tool, runs, folder), capsys)
    assert code == 1 and "late.txt" in err and "nothing was replaced" in err, err
    assert contents(folder) == {**before, "late.txt": b"mine"} and sorted(os.listdir(tmp_path)) == ["out"]
