"""
Files written whole, and the project's own JSON read back: what every writer of the project uses
so that a crash, a full disk or Ctrl-C never leaves half a file.

  atomic_write  a file written whole or not at all (a temp file renamed over it; errors name it),
                keeping the mode and group of the file it replaces, through a symlink to it (a
                cache's writer, which judges what it finds: only to a file it judges its own)
  write_together  files that are one unit (a JSON and its figure): all replaced, or none
  signals_held  a step that Ctrl-C and SIGTERM wait for (the renames of files replaced together)
  temp_name, remove_dead_temps  the names of temporary entries, and those a killed run left
  check_finite_result  no NaN or infinity recorded as a reader's result
  write_json / read_json / reading / json_number  the project's own JSON written whole, and read
                back as one line naming the file and the field when it is cut short or changed
                (or, for a table or a figure, holds a NaN or infinite number)
"""

import hashlib
import json
import math
import os
import shutil
import signal
import stat
import threading
from contextlib import ExitStack, contextmanager, nullcontext, suppress

from nanotost import cli, portable
from nanotost.cli import UserError


@contextmanager
def atomic_write(path, mode="wb", own=None, saved=None):
    """with atomic_write(path) as f: ... -- written to .<name>.tmp<pid> beside path, flushed to
    disk and renamed over path only if the block ends normally; otherwise the temp file goes
    and path is untouched. Temp files of dead processes (kill -9) are removed first. What the
    user set on the file it replaces stays: its mode and group (where allowed), and a symlink
    stays a symlink (the file it points to is the one replaced, its temp file beside it). Text
    ("w") is UTF-8 on every OS (not the locale's code page). own(path) -> bool: how a writer
    that judges what it finds (a cache) recognises its own file; where given, a symlink is
    written through only to a file it judges its own, else the link itself is replaced
    (through_link). saved: what an interrupt then leaves behind (cli.on_interrupt), said in the
    same step as the rename (an interrupt waits for both), so that it never names the file's
    earlier content."""
    with staged(path, own) as (tmp, real):
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            settle(f, real)
        with signals_held() if saved else nullcontext():
            os.replace(tmp, real)
            if saved:
                cli.on_interrupt(saved)


@contextmanager
def staged(path, own=None):
    """with staged(path) as (tmp, real): the temp file's path beside `real` (path, or the file a
    symlink at path points to: through_link), for the block to write and rename over real. If
    the block fails, the temp file goes, and an error of the temp file names path instead."""
    real = through_link(path, own)
    folder, name = os.path.split(real)
    os.makedirs(folder, exist_ok=True)
    prefix = temp_name(folder, name, "tmp")
    remove_dead_temps(folder, prefix)
    tmp = os.path.join(folder, f"{prefix}{os.getpid()}")
    try:
        yield tmp, real
    except BaseException as e:
        with suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno and (not e.filename or e.filename == tmp):  # name the file meant
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from e
        raise


def through_link(path, own=None):
    """The file a write of `path` replaces: the file a symlink at path points to (the link is
    the user's: it stays one), except where own(target) -> bool is given and does not judge the
    target the writer's own (a missing target too): then the link itself, and the file it
    points to is never touched (a link planted in a cache others can write cannot aim the
    writer at a file of the user's)."""
    real = os.path.realpath(path)
    if own is None or not os.path.islink(path):
        return real
    if os.path.isfile(real) and own(real):
        return real
    return os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))


def temp_name(folder, name, tag):
    """The start of the name of a temporary entry for `name` in `folder`: .<name>.<tag>, which
    a pid completes (remove_dead_temps finds it by it). Within the longest name the folder's file
    system takes: a name near that length is cut, a hash of the whole of it after (two long
    names stay apart), so that a legal name never fails for its temporary one."""
    prefix = f".{name}.{tag}"
    room = portable.name_max(folder if os.path.isdir(folder) else os.path.dirname(folder)) - 10  # (a pid's digits)
    if len(os.fsencode(prefix)) <= room:
        return prefix
    digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:10]
    while name and len(os.fsencode(f".{name}~{digest}.{tag}")) > room:
        name = name[:-1]
    return f".{name}~{digest}.{tag}"


def settle(f, old):
    """An open temp file made ready to replace the file `old`: flushed, given old's mode and
    group (keep_owner_and_mode), on disk (a full disk shows here, before anything is replaced)."""
    f.flush()
    keep_owner_and_mode(f.fileno(), old)
    os.fsync(f.fileno())


def dead_temps(folder, prefix):
    """The entries of folder named <prefix><pid> whose process is dead (a kill -9 left them)."""
    for entry in os.listdir(folder):
        head, pid = entry[:len(prefix)], entry[len(prefix):]
        if head == prefix and pid.isdigit() and not portable.pid_alive(int(pid)):
            yield os.path.join(folder, entry)


def remove_dead_temps(folder, prefix):
    """Remove the entries of folder named <prefix><pid> whose process is dead (a kill -9 left them)."""
    for full in list(dead_temps(folder, prefix)):
        with suppress(OSError):
            shutil.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.remove(full)


def keep_owner_and_mode(fd, old):
    """Give the open file fd the permission bits and group of the file `old` it will replace (if
    there is one): a shared run stays readable by those it was shared with. The group only where
    the OS allows it (a group the user belongs to); neither on Windows, which has no such bits."""
    try:
        st = os.stat(old)
    except OSError:  # a new file: the umask's mode, as any new file
        return
    if os.path.islink(old):  # a link replaced by a file (through_link): what it pointed to is not this file's past
        return
    if hasattr(os, "fchmod"):
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
    with suppress(OSError, AttributeError):
        if os.fstat(fd).st_gid != st.st_gid:
            os.fchown(fd, -1, st.st_gid)


class HeldSignals:
    """Ctrl-C and SIGTERM (portable.INTERRUPTS) held back from hold() to release(), then delivered to the handlers the
    script had: a step that must not be cut in two (a swap, the renames of files replaced
    together). Python-level handlers, swapped for ones that only note the signal (a thread's
    signal mask would not do: the OS may hand the signal to another thread, e.g. torch's)."""

    def __init__(self):
        self.old, self.pending = {}, []

    def hold(self):
        if threading.current_thread() is threading.main_thread():  # (handlers belong to the main thread)
            for sig in portable.INTERRUPTS:
                self.old[sig] = signal.signal(sig, lambda number, frame: self.pending.append(number))

    def release(self):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        self.old = {}
        if self.pending:
            signal.raise_signal(self.pending.pop(0))


@contextmanager
def signals_held():
    """with signals_held(): a step an interrupt must not cut (HeldSignals)."""
    held = HeldSignals()
    held.hold()
    try:
        yield
    finally:
        held.release()


def write_together(files, then=None):
    """files ({path: bytes or str}) that are one unit but not one folder (a JSON and the figure
    drawn from it, documents and their figure): every file written whole to its temp file and
    on disk first, then all renamed in a row that Ctrl-C and SIGTERM wait for. An error before
    the renames (a full disk, an interrupt) leaves every file as it was. Text is written as
    UTF-8. then(): more to do in the same row."""
    with ExitStack() as stack:
        ready = []
        for path, data in files.items():
            tmp, real = stack.enter_context(staged(path))
            with open(tmp, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                settle(f, real)
            ready.append((tmp, real))
        with signals_held():
            for tmp, real in ready:
                os.replace(tmp, real)
            if then:
                then()


def write_json(path, obj, saved=None):
    """obj as JSON at path, whole or not at all (atomic_write); `saved`, if given, becomes what an
    interrupt leaves behind (on_interrupt) with the rename: said once it is true, and from then on."""
    with atomic_write(path, "w", saved=saved) as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def read_json(path, fix, kind=dict, finite=False):
    """The project's own JSON at path, a `kind` (dict or list); a file cut short, not JSON, not
    UTF-8 or of another kind is one line naming it and `fix` (what to do: run again, restore it).
    finite: a NaN or infinite number anywhere in it is one line too, naming the field (a
    figure of a table or a picture is a measurement, and NaN would print as "nan ms")."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg}; cut short?): {fix}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 (byte {e.start}), so not a JSON this project wrote: {fix}") from None
    if not isinstance(data, kind):
        raise UserError(f"{path} holds a {type(data).__name__}, not the {kind.__name__} this project writes: {fix}")
    found = non_finite(data) if finite else None
    if found:
        raise UserError(f"{path}: {found[0]} is {json.dumps(found[1])}, not a finite number: {fix}")
    return data


def check_finite_result(record, what, advice):
    """Refuse, in one line naming the field, a result a reader would record with a NaN or an
    infinite figure (`what`: the result; `advice`: what to do): a figure that is no number is
    never written as one (json would write NaN, which is not JSON)."""
    found = non_finite(record)
    if found:
        raise UserError(f"{what}: {found[0]} is {json.dumps(found[1])}, not a finite number, so nothing was recorded: "
                        f"{advice}")


def non_finite(data, field=""):
    """(field, value) of the first NaN or infinite number in JSON data ("sections.op.rows[3].ms"),
    or None. (json reads NaN, Infinity and 1e999 without a word.)"""
    if isinstance(data, float) and not math.isfinite(data):
        return field or "the whole file", data
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = non_finite(value, f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}".lstrip("."))
        if found:
            return found
    return None


@contextmanager
def reading(path, fix):
    """with reading(path, fix): code that reads the fields of the JSON at `path`. A field it
    lacks (KeyError), of another type (a string for a number, a list for a mapping) or out of
    its range (a ValueError: said as such, never as another type) is one line naming the file,
    the field where known, and `fix`."""
    try:
        yield
    except UserError:
        raise
    except KeyError as e:
        raise UserError(f"{path} lacks the field {e.args[0]!r}: {fix}") from None
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        detail = " ".join(str(e).split())[:100]
        what = "outside the range" if isinstance(e, (ValueError, OverflowError)) else "of another type than"
        raise UserError(f"{path} holds a value {what} this version writes ({type(e).__name__}: {detail}): {fix}") \
            from None


def json_number(value, field, positive=False):
    """value, a number of a JSON (not a string that reads as one, not a bool), else a TypeError
    naming `field` (inside reading(): one line)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise TypeError(f"{field} is {value!r}, not a{' positive' if positive else ''} number")
    return value
