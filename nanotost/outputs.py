"""
A tool's outputs claimed before any work, and folders of outputs replaced as one unit: one writer
per output at a time (a lock the OS frees however the process ends), and a tool that replaces
only what its manifest says it wrote, never the user's files.

  claim_output  one writer per output (a file or a folder) at a time, claimed before any work
  claim_set     a tool's folder of outputs (an inspection's page, a prepared dataset), claimed
                before any work, with every precondition of its writing known then (OutputSet:
                one swap of folders, or in place where no swap can be made); the tool replaces
                only what it recognises by content as its own: the files its manifest lists
                whose size and sha256 still match what it wrote
  swap_folders  two folders exchanged in one step where the OS can (portable.exchange)
"""

import errno
import hashlib
import json
import os
import shutil
from contextlib import contextmanager, suppress

from nanotost import atomic, cli, lists, portable
from nanotost.cli import UserError


_claimed = {}  # absolute output path -> (its lock file or None for a folder, the locked descriptor, folders made)


FOLDER_LOCK = ".lock"  # the lock file inside a claimed folder, where the OS cannot lock a folder itself (Windows)


def claim_output(path, elsewhere, folder=False):
    """Claim the output `path` (a file, or a folder with folder=True) for this process until
    run_cli ends: a second writer, in another process, is refused in one line naming
    `elsewhere` (how to write elsewhere, e.g. "--out=<new file>"), before any work. A lock the
    OS frees when the process ends, however it ends (portable.lock). A folder is locked itself
    (or, where the OS cannot lock a folder, through .lock in it); a file through .<name>.lock
    beside it (atomic_write replaces the file, so its own inode cannot hold a lock). Creating
    the lock is also the check that the place can be written; the folders it creates for it go
    again at the release if the run left them empty."""
    key = os.path.abspath(path)
    if key in _claimed:  # this process holds it already
        return
    for _ in range(10):  # (a lock file removed by its last holder between our open and lock: again)
        fd, lock, made = _open_lock(path, folder)
        if not portable.lock(fd):
            os.close(fd)
            _remove_empty(made)
            raise UserError(f"{path} is in use by another run: wait for it to end, or write this run elsewhere "
                            f"with {elsewhere}") from None
        if lock is None or (os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(fd).st_ino):
            break
        os.close(fd)
    _claimed[key] = (lock, fd, made)
    cli.at_end(lambda: release_output(path))


def _open_lock(path, folder):
    """(a descriptor to lock, the lock file or None, the folders created) for claim_output; an
    error names `path`."""
    real = os.path.realpath(path)  # a file through a symlink: locked beside the file it points to
    target = path if folder else os.path.dirname(real)  # (an out_dir as given: errors name it so)
    made, up = [], target
    while up and not os.path.lexists(up):
        made.append(up)
        up = os.path.dirname(up)
    if folder:
        lock = None if portable.LOCKS_FOLDERS else os.path.join(path, FOLDER_LOCK)
    else:
        lock = os.path.join(target, atomic.temp_name(up or ".", os.path.basename(real), "lock"))
    try:
        os.makedirs(target, exist_ok=True)
        if lock is None:
            return os.open(path, os.O_RDONLY), None, []  # (the run's own folder: kept)
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644), lock, [] if folder else made
    except OSError as e:
        _remove_empty(made)
        if e.filename is not None and e.filename != lock:  # a folder on the way: named as it is
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from None  # the output, not its lock


def release_output(path):
    """Give up a claim_output (run_cli does it when the script ends)."""
    lock, fd, made = _claimed.pop(os.path.abspath(path), (None, None, []))
    if fd is None:
        return
    removed = False
    if lock:  # before the unlock: a waiting process then sees a new file, and checks that
        with suppress(OSError):
            os.remove(lock)
            removed = True
    os.close(fd)
    if lock and not removed:  # (Windows removes no open file: after the close, then)
        with suppress(OSError):
            os.remove(lock)
    _remove_empty(made)


def _remove_empty(folders):
    """Remove the folders (deepest first) that are empty: those a claim created and nothing used."""
    for folder in folders:
        with suppress(OSError):
            os.rmdir(folder)


MANIFEST = ".manifest.json"  # what an OutputSet wrote, in the folder with it: {"tool", "files": {name: its digest}}


def digest_of(path):
    """{"bytes", "sha256"} of the file at path: how a manifest knows the file it wrote."""
    with open(path, "rb") as f:
        return {"bytes": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


class Digesting:
    """An open binary file of a new set that keeps the digest of what is written to it (write,
    tell, flush, fileno, close, as the file's): the manifest records it without reading the
    file again. A writer that moved in the file (seek) has it read again at the end."""

    def __init__(self, f):
        self.file, self.sha256, self.bytes = f, hashlib.sha256(), 0

    def write(self, data):
        self.sha256.update(data)
        self.bytes += memoryview(data).nbytes
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def digest(self):
        if self.bytes != self.file.tell():
            self.file.flush()
            return digest_of(self.file.name)
        return {"bytes": self.bytes, "sha256": self.sha256.hexdigest()}


class OutputSet:
    """A folder of outputs replaced as one unit (lm_inspect.py's page, vit_inspect.py's pictures,
    a prepared dataset): a reader sees the earlier set whole or the new set whole, never a mix.
    Made by claim_set before any work, which knows then how the new set will go in:

      a swap (the usual way): the new set is written into a folder beside it (.<name>.tmp<pid>),
        which takes its place in one step (swap_folders), the earlier set going with it; the
        claim's lock is beside the folder, so the swap carries nothing across;
      in place (in_place), where no folder can be made beside it or swapped with it (a parent
        that cannot be written, a read-only mount around a writable one, a mount point): each
        new file written beside its old one, then all renamed in a row, the earlier set's other
        files removed with them; a reader during those milliseconds may see a mix.

    Either way the set's manifest (MANIFEST: who wrote it, each file's size and sha256) goes with
    it: the next claim replaces only the files it lists that still match. An error or an
    interrupt before the last step leaves the earlier set as it was, and says so; that step is
    not cut by an interrupt (signals wait)."""

    def __init__(self, path, real, tool, owned, in_place, manifest=True):
        self.path, self.real, self.tool, self.owned, self.in_place = path, real, tool, owned, in_place
        self.manifest = manifest  # False: the set names itself (a JSON of its own files that the claim reads)
        parent, name = os.path.split(real)
        self.staging, self.aside = (os.path.join(parent, atomic.temp_name(parent, name, tag) + str(os.getpid()))
                                    for tag in ("tmp", "old"))

    def replace(self, files):
        """files ({name: bytes, or str written as UTF-8}) become the whole folder; each keeps the
        mode of the file of the same name it replaces. Returns whether there was an earlier set."""
        with self.writing() as create:
            for name, data in files.items():
                create(name).write(data.encode("utf-8") if isinstance(data, str) else data)
        return bool(self.owned)

    @contextmanager
    def writing(self):
        """with outputs.writing() as create: create(name) gives an open binary file of the new set
        for the block to write (a dataset's tokens, streamed). When the block ends normally the
        new set (those files, each on disk, and its manifest) replaces the earlier whole; an error
        or an interrupt before leaves the earlier set as it was, an OSError as one line naming
        the file meant."""
        opened = {}  # name -> (its open file, its temporary path)

        def create(name):
            assert name == os.path.basename(name) and name not in ("", ".", "..", MANIFEST, FOLDER_LOCK) \
                and name not in opened, f"{name!r} is no new file name of the set"  # (a bug of the tool)
            opened[name] = self._open(name)
            return opened[name][0]
        try:
            if not self.in_place:
                os.mkdir(self.staging)
            yield create
            if self.manifest:
                files = {name: opened[name][0].digest() for name in sorted(opened)}
                opened[MANIFEST] = self._open(MANIFEST)
                opened[MANIFEST][0].write((json.dumps({"tool": self.tool, "files": files}, indent=1) + "\n").encode())
            for name, (f, tmp) in opened.items():
                try:
                    atomic.settle(f, os.path.join(self.real, name))
                    f.close()
                except OSError as e:  # (a write's error names no file: this one)
                    raise OSError(e.errno, e.strerror or str(e), e.filename or tmp) from e
            if not self.in_place:
                if os.path.isdir(self.real):
                    shutil.copymode(self.real, self.staging)
                portable.sync_folder(self.staging)
        except BaseException as e:
            self._abandon(opened)
            if isinstance(e, OSError):
                raise UserError(f"{cli.os_error_line(self._meant(e, opened))}; {cli.left_behind()}") from None
            raise
        self._commit({name: tmp for name, (_, tmp) in opened.items()})

    def _open(self, name):
        """(an open binary file, its path): in the folder beside this one, or in place beside the
        file it will replace (.<name>.tmp<pid>)."""
        if self.in_place:
            tmp = os.path.join(self.real, atomic.temp_name(self.real, name, "tmp") + str(os.getpid()))
        else:
            tmp = os.path.join(self.staging, name)
        return Digesting(open(tmp, "wb")), tmp

    def _abandon(self, opened):
        """The new set's files ({name: (open file or None, path)}), closed and removed: nothing
        of it is left."""
        for f, tmp in opened.values():
            if f is not None:
                f.close()
            if self.in_place:
                with suppress(OSError):
                    os.remove(tmp)
        if not self.in_place:
            shutil.rmtree(self.staging, ignore_errors=True)

    def _meant(self, e, opened):
        """The OSError e, naming the output meant instead of its temporary path."""
        meant = {tmp: os.path.join(self.path, name) for name, (_, tmp) in opened.items()}
        name = meant.get(e.filename, e.filename)
        if not name or str(name).startswith(self.staging):
            name = self.path
        return OSError(e.errno, e.strerror or str(e), name)

    def _commit(self, temps):
        """The new set ({name: its temporary path}, all on disk) takes the earlier one's place."""
        if not self.in_place:
            swapped = False
            try:
                with atomic.signals_held():  # (an interrupt now is delivered once all is done)
                    swapped = self._swap()
            finally:  # (an interrupt held over the swap is raised at its end: the earlier set still goes)
                if swapped:
                    shutil.rmtree(self.staging, ignore_errors=True)  # the earlier set, now under the temporary name
                    self._written()
            if swapped:
                return
            temps = self._copy_in(temps)  # a mount point the claim could not see: in place after all
        stale = [os.path.join(self.real, n) for n in self.owned if n not in temps]
        try:
            with atomic.signals_held():
                for name, tmp in temps.items():
                    os.replace(tmp, os.path.join(self.real, name))
                for path in stale:
                    with suppress(FileNotFoundError):
                        os.remove(path)
                cli.on_interrupt(f"{self.path} holds the new set, whole")
        except OSError as e:
            self._abandon({name: (None, tmp) for name, tmp in temps.items()})
            raise UserError(f"{cli.os_error_line(e)}; {cli.left_behind()}") from None
        self._written()

    def _written(self):
        """The set is written: the claim ends (the next run may begin; a claim_set of this
        process again claims it anew)."""
        release_output(self.path)
        _sets.pop(self.real, None)

    def _swap(self):
        """The folder beside takes the folder's place (True), or not where the OS says the folder
        cannot be moved (False: a mount point os.path.ismount cannot see, e.g. a bind mount)."""
        try:
            self._unchanged()
            if os.path.isdir(self.real):
                swap_folders(self.staging, self.real, self.aside)
            else:
                os.rename(self.staging, self.real)
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.EBUSY):
                return False
            shutil.rmtree(self.staging, ignore_errors=True)
            raise UserError(f"{cli.os_error_line(OSError(e.errno, e.strerror, self.path))}; {cli.left_behind()}") from None
        except UserError:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        cli.on_interrupt(f"{self.path} holds the new set, whole")
        return True

    def _unchanged(self):
        """Refuse to swap away a file the user put in the folder while this run worked."""
        new = sorted(set(os.listdir(self.real)) - set(self.owned) - {FOLDER_LOCK}) if os.path.isdir(self.real) else []
        if new:
            raise UserError(f"{self.path} now holds files {self.tool} did not write ({', '.join(new[:3])}), put "
                            f"there while this run worked: nothing was replaced; move them, and run again")

    def _copy_in(self, temps):
        """The new set's files, copied from the folder beside into temporary files in the folder
        (each on disk): {name: its temporary path there}. The folder beside goes."""
        self.in_place, copies = True, {}
        try:
            for name, tmp in temps.items():
                f, copy = self._open(name)
                copies[name] = (f, copy)
                with open(tmp, "rb") as source:
                    shutil.copyfileobj(source, f, 1 << 20)
                atomic.settle(f, os.path.join(self.real, name))
                f.close()
        except BaseException as e:
            self._abandon(copies)
            shutil.rmtree(self.staging, ignore_errors=True)
            if isinstance(e, OSError):
                raise UserError(f"{cli.os_error_line(self._meant(e, copies))}; {cli.left_behind()}") from None
            raise
        shutil.rmtree(self.staging, ignore_errors=True)
        return {name: copy for name, (_, copy) in copies.items()}


_sets = {}  # folder claimed by claim_set -> its OutputSet


def claim_set(path, elsewhere, tool, legacy=(), manifest=True):
    """Claim the folder `path` for a set of outputs of `tool` (its name in messages and in the
    set's manifest: "lm_inspect.py") before any work, every precondition of the writing known
    then (OutputSet): one writer at a time (claim_output: a lock beside the folder, or in it
    where no swap can be made), a place that can be written, and which way the new set goes in
    (a swap, or in place: a mount point, a parent that cannot be written). The folder may be
    new, empty, or hold an earlier set of this tool: the files its manifest lists, or, for a set
    written before manifests, those legacy names (names, or a function of the folder that
    returns them: those a tool's own JSON lists). manifest=False writes no manifest, for a set
    that must hold its own files alone (export.py's folder for the Hub): its legacy function
    always knows it. Anything else in it is the user's: refused in one line naming `elsewhere`,
    and never deleted. What killed runs left (temporary files and
    folders of dead processes) is undone first. A symlink to the folder stays a symlink: the
    folder it points to is the one replaced."""
    real = os.path.realpath(path)
    if os.path.exists(real) and not os.path.isdir(real):
        raise UserError(f"{path} is a file, not a folder: write elsewhere with {elsewhere}")
    if real in _sets:  # this process holds it already (a script's main called again)
        return _sets[real]
    in_place = _cannot_swap(real)
    claim_output(path, elsewhere, folder=in_place)
    try:
        _undo_killed(real)
        if in_place:
            _check_writable(path, real)
        owned = _owned(path, real, tool, legacy(real) if callable(legacy) else legacy, elsewhere)
    except BaseException:
        release_output(path)  # refused: the folder as it was
        raise
    _sets[real] = OutputSet(path, real, tool, owned, in_place, manifest)
    cli.at_end(lambda: _sets.pop(real, None))
    if owned:
        cli.on_interrupt(f"nothing was replaced: {path} holds its earlier files, whole")
    return _sets[real]


def _cannot_swap(real):
    """Whether no new set can be made beside the folder `real` and swapped with it: the folder
    is a mount point (portable.is_mount_point), or no folder can be made in its parent
    (permissions, a read-only mount around a writable one; found by making one). A folder not
    made yet is made by the swap."""
    if not os.path.isdir(real):
        return False
    if portable.is_mount_point(real):
        return True
    parent, name = os.path.split(real)
    probe = os.path.join(parent, atomic.temp_name(parent, name, "tmp") + str(os.getpid()))
    try:
        os.mkdir(probe)
    except FileExistsError:  # (this process's own, from a call that failed)
        return False
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return True
        raise
    os.rmdir(probe)
    return False


def _check_writable(path, real):
    """Refuse, in one line naming `path`, a folder whose files cannot be written (found by
    writing the manifest's temporary file, which the set then writes for real)."""
    probe = os.path.join(real, atomic.temp_name(real, MANIFEST, "tmp") + str(os.getpid()))
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644))
        os.remove(probe)
    except OSError as e:
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from None


STAGING_TAGS = ("tmp", "new")  # a set's folder beside it being written (.<name>.<tag><pid>): this version's, issue 40's


def _undo_killed(real):
    """Undo what killed runs left (kill -9, a power cut), of this version or an earlier one (what
    a run that was alive is never touched: the pid in each name says whose it is): a new set's
    folder beside the folder goes; an earlier set a swap by two renames had set aside
    (.<name>.old<pid>) comes back if the new one had not taken its place, and goes if it had;
    temporary files in the folder go."""
    parent, name = os.path.split(real)
    with suppress(OSError):  # (a parent that cannot be listed: nothing of ours to clean there)
        for tag in STAGING_TAGS:
            atomic.remove_dead_temps(parent, atomic.temp_name(parent, name, tag))
        for aside in list(atomic.dead_temps(parent, atomic.temp_name(parent, name, "old"))):
            if os.path.lexists(real):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, real)
    if os.path.isdir(real):
        for entry in os.listdir(real):
            head, sep, pid = entry.rpartition(".tmp")
            if sep and head.startswith(".") and pid.isdigit() and not portable.pid_alive(int(pid)):
                with suppress(OSError):
                    os.remove(os.path.join(real, entry))


def _owned(path, real, tool, legacy, elsewhere):
    """The names in the folder that are this tool's earlier set, or one line refusing a folder
    that holds anything else (claim_set). Recognised by content: the files the tool's manifest
    lists that still have the size and sha256 it recorded (a file the user put in their place,
    or a manifest that lists a file of the user's, is not the tool's). A manifest that is
    damaged, or of an earlier version (names alone), is the tool's own file, and the set's
    other files are then known as a set written before manifests is (legacy)."""
    if not os.path.isdir(real):
        return set()
    entries = set(os.listdir(real)) - {FOLDER_LOCK}
    manifest = _manifest(real)
    if isinstance(manifest, dict) and manifest["tool"] != tool:
        raise UserError(f"{path} holds the outputs of {manifest['tool']}, which {tool} does not replace: write "
                        f"elsewhere with {elsewhere}")
    if isinstance(manifest, dict) and isinstance(manifest["files"], dict):
        owned = {n for n, recorded in manifest["files"].items() if n in entries and _matches(real, n, recorded)}
        changed = sorted(entries & set(manifest["files"]) - owned)
    else:
        owned, changed = {n for n in entries & set(legacy) if _plain_file(real, n)}, []
    if manifest is not None and _plain_file(real, MANIFEST):
        owned.add(MANIFEST)
    if changed:  # (the tool's names, not the tool's files: damaged, or the user's in their place)
        it = "it" if len(changed) == 1 else "them"
        raise UserError(f"{path} holds {lists.few(changed)}, changed since {tool} wrote {it} (damaged, or another "
                        f"file in its place), and its outputs replace the whole folder: nothing was replaced; move "
                        f"or delete {it} to write the set again, or write elsewhere with {elsewhere}")
    others = sorted(entries - owned)
    if others:
        raise UserError(f"{path} holds files {tool} did not write ({', '.join(others[:3])}"
                        f"{', ...' if len(others) > 3 else ''}), and its outputs replace the whole folder: "
                        f"give a new or empty folder with {elsewhere}")
    return owned


def _plain_file(real, name):
    """Whether the entry `name` of the folder is a file itself (not a folder, not a link)."""
    full = os.path.join(real, name)
    return os.path.isfile(full) and not os.path.islink(full)


def _matches(real, name, recorded):
    """Whether the file `name` of the folder is still the one a manifest recorded (its size, then
    its sha256: a file of the same name the user put there is not)."""
    if not _plain_file(real, name) or not isinstance(recorded, dict):
        return False
    if os.path.getsize(os.path.join(real, name)) != recorded.get("bytes"):
        return False
    return digest_of(os.path.join(real, name)) == recorded


def _manifest(real):
    """The folder's manifest: {"tool", "files"} where it is one this code reads (files: {name:
    digest}, or an earlier version's [names]), "damaged" where the file is there but is none,
    None where there is none."""
    path = os.path.join(real, MANIFEST)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        tool, files = manifest["tool"], manifest["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return "damaged"
    names = list(files) if isinstance(files, (dict, list)) else None
    if not isinstance(tool, str) or names is None or not all(isinstance(n, str) for n in names):
        return "damaged"
    return manifest


def swap_folders(a, b, aside=None):
    """Exchange folders a and b: in one step where the OS can (portable.exchange: Linux's
    renameat2); elsewhere two renames through `aside` (b set aside, a in its place, then aside
    to a): between them b is absent for a moment, never a mix of two sets, and a run killed
    there leaves aside, which the next claim_set puts back."""
    if portable.exchange(a, b):
        return
    aside = aside or f"{a}.old"
    os.rename(b, aside)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(aside, b)
        raise
    os.rename(aside, a)
