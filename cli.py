"""
The one error path and the settings of every script (the trainers, sample.py, evaluate.py,
the preparation scripts, bench.py, lra/, recall/), so that each script reads as its story:

  run_cli     a mistake the user can fix (UserError), a file-system error (with the file, and
              the variable that moves a package's cache), a text file that is not UTF-8, memory
              that ran out, Ctrl-C / SIGTERM -> one line, exit 1 (130 for an interrupt); real
              bugs keep their traceback (NANOTOST_DEBUG=1: every traceback)
  interrupts_reach_c  Ctrl-C / SIGTERM end the process even while its main thread is held in C
              code (a DDP rank waiting in a collective), with one line saying where
  configure   module globals, then config files, then --key=value (--help lists them); whole
              numbers within int64, finite floats
  check       every setting checked once by kind before any work, and every number must have
              a kind (a range); require for the rest
  atomic_write  a file written whole or not at all (a temp file renamed over it; errors name it),
              keeping the mode and group of the file it replaces, through a symlink to it
  write_together  files that are one unit (a JSON and its figure): all replaced, or none
  claim_set   a tool's folder of outputs (an inspection's page, a prepared dataset), claimed
              before any work, with every precondition of its writing known then (OutputSet:
              one swap of folders, or in place where no swap can be made); the tool replaces
              only what its manifest lists, never the user's files
  claim_output  one writer per output (a file or a folder) at a time, claimed before any work;
              write_json / read_json / reading: the project's own JSON written whole, and read
              back as one line naming the file and the field when it is cut short or changed
              (or, for a table or a figure, holds a NaN or infinite number)
  parse_list  every list-valued setting (names, numbers, key:value pairs): one rule, each item once
  pyplot      matplotlib for files, text drawn as given (a `$` is a dollar sign)

    def main(argv):
        C, given = cli.configure(cli.config_defaults(globals()), argv)
        cli.check(C, at_least_1=("max_iters",), seed=("seed",), choices={"device": ...})

and, under the script's __main__ guard, cli.run_cli(main, sys.argv[1:]). What differs between
Linux, macOS and Windows (locks, swaps, signals) is portable.py's.
"""

import ast
import difflib
import errno
import getpass
import hashlib
import json
import math
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from contextlib import ExitStack, contextmanager, suppress
from types import SimpleNamespace

import portable

# -----------------------------------------------------------------------------
# one error path


class UserError(Exception):
    """A mistake the person running a script can fix: run_cli prints it as one line."""


class ConfigError(UserError, ValueError):
    """A config file or --key=value that does not fit the script's settings."""


_on_interrupt = ["nothing was saved"]  # what an interrupt leaves behind: scripts update it
_said = [threading.Lock()]  # held by whoever says "interrupted": run_cli, or interrupts_reach_c's thread
_cleanups = []  # what run_cli undoes when the script ends, however it ends (at_end)


def on_interrupt(text):
    """Say what an interrupt now leaves behind (e.g. which checkpoint, how to continue)."""
    _on_interrupt[0] = text


def left_behind():
    """What the run leaves behind if it ends now (the text of the last on_interrupt)."""
    return _on_interrupt[0]


def at_end(undo):
    """Have run_cli call undo() when the script ends, however it ends."""
    _cleanups.append(undo)


def _cache_roots():
    """The caches other packages write, by the variables that move them: {variables: [folders]}."""
    home, tmp = os.path.expanduser("~"), tempfile.gettempdir()  # where tiktoken and inductor put theirs
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return {"HF_HOME (or HF_DATASETS_CACHE)": [os.environ.get("HF_DATASETS_CACHE"), os.environ.get("HF_HOME"),
                                               os.path.join(xdg, "huggingface")],
            "TIKTOKEN_CACHE_DIR": [os.environ.get("TIKTOKEN_CACHE_DIR"), os.environ.get("DATA_GYM_CACHE_DIR"),
                                   os.path.join(tmp, "data-gym-cache")],
            "TRITON_CACHE_DIR": [os.environ.get("TRITON_CACHE_DIR"), os.path.join(home, ".triton")],
            "TORCHINDUCTOR_CACHE_DIR": [os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                                        os.path.join(tmp, f"torchinductor_{_user()}")]}


def _user():
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (some containers)
        return ""


def _cache_of(path):
    """The variables that move the package cache `path` lies in, or None. A folder on the way to
    one inside the home folder counts too (~/.cache of a read-only home)."""
    path, home = os.path.abspath(str(path)), os.path.expanduser("~")
    for variables, roots in _cache_roots().items():
        for root in filter(None, roots):
            root = os.path.abspath(root)
            on_the_way = path.startswith(home + os.sep) and root.startswith(path + os.sep)
            if path == root or path.startswith(root + os.sep) or on_the_way:
                return variables
    return None


def os_error_line(e):
    """One line for a file-system error: what, where (when known), and what to do."""
    what = e.strerror or str(e)
    code = errno.errorcode.get(e.errno, "")
    advice = {"ENOSPC": "free some space or write elsewhere", "EDQUOT": "free some space or write elsewhere",
              "EACCES": "check its permissions or write elsewhere", "EPERM": "check its permissions or write elsewhere",
              "EROFS": "write elsewhere", "EISDIR": "give a file, not a folder",
              "ENOTDIR": "a file stands where a folder is expected: move it or choose another path",
              "ENOENT": "check the path"}.get(code, "check the path")
    if code == "EEXIST" and e.filename and not os.path.isdir(e.filename):  # (os.makedirs over a file)
        advice = "it is not a folder, and a folder is expected there: move it or choose another path"
    cache = _cache_of(e.filename) if e.filename else None
    if cache:  # another package's cache (a read-only HOME, say): the variable that moves it
        advice = f"it is a package's cache: set {cache} to a folder this process can write"
    return f"{what}: {e.filename!r}: {advice}" if e.filename else f"{what}: {advice}"


def _out_of_memory(e):
    """Whether an exception is torch's (or Python's) way of saying memory ran out."""
    text = str(e)
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or \
        (isinstance(e, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text))


def script_name(path):
    """How messages name a script: train.py, or lra/train.py for one in a folder of the repository."""
    parts = os.path.normpath(path).split(os.sep)
    repo = os.path.dirname(os.path.abspath(__file__))
    in_folder = len(parts) >= 2 and os.path.isfile(os.path.join(repo, *parts[-2:]))
    return "/".join(parts[-2:]) if in_folder else parts[-1]


def run_cli(main, *args):
    """Run a script's main(*args) for a person at a terminal (see the module docstring)."""
    name = script_name(sys.argv[0])
    if os.environ.get("NANOTOST_DEBUG"):
        return main(*args)
    old = {s: signal.signal(s, signal.default_int_handler)  # SIGTERM (a scheduler, kill) ends as Ctrl-C
           for s in INTERRUPTS if s != signal.SIGINT}
    _on_interrupt[0] = "nothing was saved"
    _said[0] = threading.Lock()
    try:
        result = main(*args)
        sys.stdout.flush()  # a reader that went away (| head) shows here, not at exit
        return result
    except UserError as e:
        sys.exit(f"{name}: {e}")
    except BrokenPipeError as e:
        if e.filename is not None or not stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode):
            sys.exit(f"{name}: {os_error_line(e)}")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as `cmd | head`: stop, quietly
        sys.exit(141)  # what a shell reports for a command ended by SIGPIPE
    except OSError as e:
        sys.exit(f"{name}: {os_error_line(e)}")
    except UnicodeDecodeError as e:  # a text file that is not UTF-8 (scripts name the file where they can)
        sys.exit(f"{name}: a file is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                 "convert it first, e.g. iconv -f <encoding> -t utf-8")
    except (MemoryError, RuntimeError) as e:  # sizes the machine cannot hold; any other RuntimeError is a bug
        if not _out_of_memory(e):
            raise
        sys.exit(f"{name}: out of memory ({' '.join(str(e).split())[-120:]}): make the run smaller (batch size, "
                 f"sequence length, model size) or use a device with more memory; {_on_interrupt[0]}")
    except KeyboardInterrupt:
        if _said[0].acquire(blocking=False):  # (else interrupts_reach_c's thread said it, and ends the process)
            print(f"{name}: interrupted; {_on_interrupt[0]}", file=sys.stderr)
        sys.exit(130)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        while _cleanups:  # the run is over, however it ended (e.g. trainkit's out_dir lock)
            _cleanups.pop()()


INTERRUPT_GRACE_S = 2.0  # how long a main thread has to take an interrupt before interrupts_reach_c ends the process
INTERRUPTS = portable.INTERRUPTS  # Ctrl-C, SIGTERM (and Ctrl-Break on Windows): what ends a run as an interrupt
_watched = [False]  # whether interrupts_reach_c's helper thread reads this process's signals now


def _unwatch_in_child():
    """A process forked inside interrupts_reach_c (a DataLoader worker) would write its own
    signals to the parent's helper thread (the wakeup socket is shared): a worker that the
    loader terminates would end the parent. The child has no helper: it writes nowhere."""
    if _watched[0]:
        _watched[0] = False
        with suppress(ValueError):  # (a fork from a thread the child does not take as its main one)
            signal.set_wakeup_fd(-1)


if hasattr(os, "register_at_fork"):  # (Windows has no fork)
    os.register_at_fork(after_in_child=_unwatch_in_child)


@contextmanager
def interrupts_reach_c(describe, grace_s=INTERRUPT_GRACE_S):
    """Within the block, Ctrl-C and SIGTERM end the process even while its main thread is held in
    C code: a DDP rank waiting in a collective for a rank that stopped. Python runs a signal
    handler only between the main thread's bytecodes, so KeyboardInterrupt would wait for the
    call to return (with gloo, until its timeout), and a launcher's SIGTERM would leave the rank
    running. The C-level handler still writes the signal's number to signal.set_wakeup_fd: a
    helper thread reads it, and when the main thread has not taken the interrupt within
    grace_s, the thread says so in one line, with describe(the main thread's innermost frame)
    saying what it is held in, and ends the process (os._exit(130): the main thread can run no
    Python). Signals ignored or at their default action (which ends a process) are left alone."""
    if threading.current_thread() is not threading.main_thread():  # (only the main thread sets handlers)
        yield
        return
    old = {s: signal.getsignal(s) for s in INTERRUPTS if callable(signal.getsignal(s))}
    taken = [0]  # interrupts whose Python handler ran: the main thread took them

    def take(signum, frame):
        taken[0] += 1
        return old[signum](signum, frame)

    reader, writer = socket.socketpair()
    writer.setblocking(False)  # (the C-level handler must never block)
    for signum in old:
        signal.signal(signum, take)
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _watched[0] = True
    helper = threading.Thread(target=_end_when_held, args=(reader, taken, describe, grace_s), daemon=True)
    helper.start()
    try:
        yield
    finally:
        _watched[0] = False
        signal.set_wakeup_fd(old_fd)
        for signum, handler in old.items():
            signal.signal(signum, handler)
        writer.send(b"\0")  # (no signal is numbered 0: the helper's cue to stop)
        helper.join()
        writer.close()


def _end_when_held(reader, taken, describe, grace_s):
    """interrupts_reach_c's helper thread: each interrupt the main thread has not taken within
    grace_s ends the process with one line (unless run_cli has said it already)."""
    heard = 0
    with reader:
        while True:
            data = reader.recv(64)
            if not data or 0 in data:  # the block ended
                return
            signums = [n for n in data if n in INTERRUPTS]
            heard += len(signums)
            deadline = time.monotonic() + grace_s
            while signums and taken[0] < heard and time.monotonic() < deadline:
                time.sleep(0.05)
            if signums and taken[0] < heard and _said[0].acquire(blocking=False):
                try:
                    held = describe(sys._current_frames().get(threading.main_thread().ident))
                except Exception:  # (a bug in describe must not keep the process alive)
                    held = "its main thread was held in C code"
                print(f"{script_name(sys.argv[0])}: interrupted ({signal.Signals(signums[-1]).name}) while {held}; "
                      f"{_on_interrupt[0]}", file=sys.stderr, flush=True)
                os._exit(130)


@contextmanager
def atomic_write(path, mode="wb"):
    """with atomic_write(path) as f: ... -- written to .<name>.tmp<pid> beside path, flushed to
    disk and renamed over path only if the block ends normally; otherwise the temp file goes
    and path is untouched. Temp files of dead processes (kill -9) are removed first. What the
    user set on the file it replaces stays: its mode and group (where allowed), and a symlink
    stays a symlink (the file it points to is the one replaced, its temp file beside it). Text
    ("w") is UTF-8 on every OS (not the locale's code page)."""
    with staged(path) as (tmp, real):
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            settle(f, real)
        os.replace(tmp, real)


@contextmanager
def staged(path):
    """with staged(path) as (tmp, real): the temp file's path beside `real` (path, or the file a
    symlink at path points to), for the block to write and rename over real. If the block fails,
    the temp file goes, and an error of the temp file names path instead."""
    real = os.path.realpath(path)  # (a symlink's target: the link itself is the user's)
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
        if head == prefix and pid.isdigit() and not pid_alive(int(pid)):
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
    if hasattr(os, "fchmod"):
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
    with suppress(OSError, AttributeError):
        if os.fstat(fd).st_gid != st.st_gid:
            os.fchown(fd, -1, st.st_gid)


def write_json(path, obj, saved=None):
    """obj as JSON at path, whole or not at all (atomic_write); then `saved`, if given, becomes
    what an interrupt leaves behind (on_interrupt): said only once it is true."""
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    if saved:
        on_interrupt(saved)


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
    lacks (KeyError) or of another type (a string for a number, a list for a mapping, a number
    out of range) is one line naming the file, the field where known, and `fix`."""
    try:
        yield
    except UserError:
        raise
    except KeyError as e:
        raise UserError(f"{path} lacks the field {e.args[0]!r}: {fix}") from None
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        detail = " ".join(str(e).split())[:100]
        raise UserError(f"{path} holds a value of another type than this version writes ({type(e).__name__}: "
                        f"{detail}): {fix}") from None


def json_number(value, field, positive=False):
    """value, a number of a JSON (not a string that reads as one, not a bool), else a TypeError
    naming `field` (inside reading(): one line)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise TypeError(f"{field} is {value!r}, not a{' positive' if positive else ''} number")
    return value


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
    at_end(lambda: release_output(path))


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
        lock = os.path.join(target, temp_name(up or ".", os.path.basename(real), "lock"))
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


MANIFEST = ".manifest.json"  # what an OutputSet wrote: {"tool": who, "files": [names]}, in the folder with them


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

    Either way the set's manifest (MANIFEST: who wrote it, its files) goes with it: the next
    claim replaces only what it lists. An error or an interrupt before the last step leaves the
    earlier set as it was, and says so; that step is not cut by an interrupt (signals wait)."""

    def __init__(self, path, real, tool, owned, in_place, manifest=True):
        self.path, self.real, self.tool, self.owned, self.in_place = path, real, tool, owned, in_place
        self.manifest = manifest  # False: the set names itself (a JSON of its own files that the claim reads)
        parent, name = os.path.split(real)
        self.staging, self.aside = (os.path.join(parent, temp_name(parent, name, tag) + str(os.getpid()))
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
                files = sorted(opened)
                opened[MANIFEST] = self._open(MANIFEST)
                opened[MANIFEST][0].write((json.dumps({"tool": self.tool, "files": files}, indent=1) + "\n").encode())
            for name, (f, tmp) in opened.items():
                try:
                    settle(f, os.path.join(self.real, name))
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
                raise UserError(f"{os_error_line(self._meant(e, opened))}; {left_behind()}") from None
            raise
        self._commit({name: tmp for name, (_, tmp) in opened.items()})

    def _open(self, name):
        """(an open binary file, its path): in the folder beside this one, or in place beside the
        file it will replace (.<name>.tmp<pid>)."""
        if self.in_place:
            tmp = os.path.join(self.real, temp_name(self.real, name, "tmp") + str(os.getpid()))
        else:
            tmp = os.path.join(self.staging, name)
        return open(tmp, "wb"), tmp

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
            with signals_held():  # (an interrupt now is delivered once all is done)
                swapped = self._swap()
            if swapped:
                shutil.rmtree(self.staging, ignore_errors=True)  # the earlier set, now under the temporary name
                self._written()
                return
            temps = self._copy_in(temps)  # a mount point the claim could not see: in place after all
        stale = [os.path.join(self.real, n) for n in self.owned if n not in temps]
        try:
            with signals_held():
                for name, tmp in temps.items():
                    os.replace(tmp, os.path.join(self.real, name))
                for path in stale:
                    with suppress(FileNotFoundError):
                        os.remove(path)
                on_interrupt(f"{self.path} holds the new set, whole")
        except OSError as e:
            self._abandon({name: (None, tmp) for name, tmp in temps.items()})
            raise UserError(f"{os_error_line(e)}; {left_behind()}") from None
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
            raise UserError(f"{os_error_line(OSError(e.errno, e.strerror, self.path))}; {left_behind()}") from None
        except UserError:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        on_interrupt(f"{self.path} holds the new set, whole")
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
                settle(f, os.path.join(self.real, name))
                f.close()
        except BaseException as e:
            self._abandon(copies)
            shutil.rmtree(self.staging, ignore_errors=True)
            if isinstance(e, OSError):
                raise UserError(f"{os_error_line(self._meant(e, copies))}; {left_behind()}") from None
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
    at_end(lambda: _sets.pop(real, None))
    if owned:
        on_interrupt(f"nothing was replaced: {path} holds its earlier files, whole")
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
    probe = os.path.join(parent, temp_name(parent, name, "tmp") + str(os.getpid()))
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
    probe = os.path.join(real, temp_name(real, MANIFEST, "tmp") + str(os.getpid()))
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644))
        os.remove(probe)
    except OSError as e:
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from None


def _undo_killed(real):
    """Undo what killed runs left (kill -9, a power cut): a new set's folder beside the folder
    goes; an earlier set a swap by two renames had set aside (.<name>.old<pid>) comes back if
    the new one had not taken its place, and goes if it had; temporary files in the folder go."""
    parent, name = os.path.split(real)
    with suppress(OSError):  # (a parent that cannot be listed: nothing of ours to clean there)
        remove_dead_temps(parent, temp_name(parent, name, "tmp"))
        for aside in list(dead_temps(parent, temp_name(parent, name, "old"))):
            if os.path.lexists(real):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, real)
    if os.path.isdir(real):
        for entry in os.listdir(real):
            head, sep, pid = entry.rpartition(".tmp")
            if sep and head.startswith(".") and pid.isdigit() and not pid_alive(int(pid)):
                with suppress(OSError):
                    os.remove(os.path.join(real, entry))


def _owned(path, real, tool, legacy, elsewhere):
    """The names in the folder that are this tool's earlier set, or one line refusing a folder
    that holds anything else (claim_set)."""
    if not os.path.isdir(real):
        return set()
    entries = set(os.listdir(real)) - {FOLDER_LOCK}
    manifest = _manifest(real)
    if manifest and manifest["tool"] != tool:
        raise UserError(f"{path} holds the outputs of {manifest['tool']}, which {tool} does not replace: write "
                        f"elsewhere with {elsewhere}")
    listed = set(manifest["files"]) | {MANIFEST} if manifest else set(legacy)
    owned = {n for n in entries & listed if os.path.isfile(os.path.join(real, n))}
    others = sorted(entries - owned)
    if others:
        raise UserError(f"{path} holds files {tool} did not write ({', '.join(others[:3])}"
                        f"{', ...' if len(others) > 3 else ''}), and its outputs replace the whole folder: "
                        f"give a new or empty folder with {elsewhere}")
    return owned


def _manifest(real):
    """The folder's manifest ({"tool", "files"}), or None: none, or one this code did not write."""
    try:
        with open(os.path.join(real, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        tool, files = manifest["tool"], manifest["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(tool, str) or not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        return None
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


class HeldSignals:
    """Ctrl-C and SIGTERM (INTERRUPTS) held back from hold() to release(), then delivered to the handlers the
    script had: a step that must not be cut in two (a swap, the renames of files replaced
    together). Python-level handlers, swapped for ones that only note the signal (a thread's
    signal mask would not do: the OS may hand the signal to another thread, e.g. torch's)."""

    def __init__(self):
        self.old, self.pending = {}, []

    def hold(self):
        if threading.current_thread() is threading.main_thread():  # (handlers belong to the main thread)
            for sig in INTERRUPTS:
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


def pyplot():
    """matplotlib.pyplot for drawing into files (the Agg backend: no display needed), with text
    drawn as given: mathtext off, so a `$` in a path, a prompt, a token or a name is a dollar
    sign, never the start of a formula that fails to parse after all the work. Every figure of
    the project is drawn through this."""
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    return plt


def pid_alive(pid):
    """Whether process `pid` is alive (portable.pid_alive)."""
    return portable.pid_alive(pid)


def require(condition, message):
    """Check a setting: raise ConfigError(message) when `condition` is false."""
    if not condition:
        raise ConfigError(message)


def unread(given, names, why):
    """Refuse, in one line, the settings among `names` that were given (a config file or
    --key=value) where this run never reads them: a setting given must do something. why: which
    mode reads them and what to do."""
    ignored = [f"--{k}" for k in names if k in given]
    require(not ignored, f"{', '.join(ignored)}: {why}")


def build(make, *args, **kwargs):
    """make(*args, **kwargs), a ValueError it raises (a library's rule between settings, as
    model.GPTConfig's) given as one line (ConfigError): the rule is written once, where it belongs."""
    try:
        return make(*args, **kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None


INT64 = 2**63 - 1  # the largest whole number a setting may hold: torch and numpy index with int64
SEED_MAX = 2**32 - 1  # seeds: numpy's legacy seeding (np.random.seed) takes 0..2**32-1, torch takes those too
MAX_WORKERS = max(64, 4 * (os.cpu_count() or 1))  # threads / processes: more only thrash (or crash torch)


ITEMS = {str: "names", int: "whole numbers", float: "numbers"}  # how parse_list's messages name the items


def parse_list(key, text, item=str, allowed=None, pairs=False, what=None):
    """The one rule of every list-valued setting of every script: a comma-separated list ("op,
    decode", "1,6", "op:200,decode:100"; a repeated option's values, given as a list), as a list
    of its items, each parsed by `item` (str, int, float, or a function that raises ValueError),
    each one of `allowed` where given, and each given once: an item twice (the same once parsed:
    "1,01"; with pairs, the same key of key:value items, or two without a key) is one line, as
    an empty list or item is. pairs: items are "value" or "key:value", returned as (key or None,
    value). `what` names the items in messages (default: ITEMS[item])."""
    what = what or ITEMS.get(item, "values")
    parts = [p.strip() for p in (text if isinstance(text, list) else str(text).split(","))]
    if isinstance(text, list):  # (a repeated option's values, shown as given)
        text = " ".join(f"{key}={value}" for value in text)
    choose = "" if allowed is None else f" (choose from {', '.join(map(str, allowed))})"
    require(parts and all(parts), f"{key} must be {what} separated by commas{choose}, got {text!r}")
    values, written = [], {}  # (written: each item as given, by what it parses to)
    for part in parts:
        name, sep, value = part.rpartition(":") if pairs else ("", "", part)
        try:
            parsed = item(value.strip())
        except (ValueError, TypeError, OverflowError):
            raise ConfigError(f"{key} must be {what} separated by commas: {part!r} is not one, got {text!r}") from None
        values.append((name.strip() if sep else None, parsed) if pairs else parsed)
        written.setdefault(values[-1][0] if pairs else parsed, (name.strip() if sep else "all") if pairs else part)
    ids = [v[0] for v in values] if pairs else values
    twice = [written[v] for v in dict.fromkeys(v for v in ids if ids.count(v) > 1)]
    require(not twice, f"{key} names {', '.join(twice)} more than once: name each once, got {text!r}")
    unknown = [v for v in ids if allowed is not None and v is not None and v not in allowed]
    if unknown:
        raise ConfigError(f"{key}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(map(str, allowed))}")
    return values


def name_list(key, text, allowed=None):
    """A comma-separated list of names ("op,decode"), each once, each one of `allowed` where given
    (parse_list)."""
    return parse_list(key, text, allowed=allowed)


def seed_list(key, text):
    """A comma-separated list of seeds ("1337,1338") as ints, each named once (parse_list) and a
    seed cli.check would accept (whole, 0..SEED_MAX): the numbers inside a text setting get the same range."""
    seeds = parse_list(key, text, int)
    for s in seeds:
        require(0 <= s <= SEED_MAX, f"{key}: {s} is no seed: each must be a whole number in 0..{SEED_MAX} "
                                     f"(2**32 - 1, what numpy and torch take)")
    return seeds


def writable_place(path, option):
    """Refuse, before any work, an output path that cannot be created: the part of it that
    exists must be a folder this process can write into. `option` names the setting."""
    target = os.path.abspath(path)
    existing = target
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    wants_folder = path.endswith(("/", os.sep))
    if (existing != target or wants_folder) and not os.path.isdir(existing):
        raise UserError(f"{existing} is a file, so {option}={path} cannot be written: choose another {option}")
    folder = existing if os.path.isdir(existing) else os.path.dirname(existing)  # (an existing file: replaced)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{folder} is not writable (permission denied), so {option}={path} cannot be written: "
                        f"choose another {option}")


def check(C, *, at_least_1=(), non_negative=(), positive=(), fraction=(), seed=(), workers=(), between=None,
          choices=None, dashes=False):
    """Check the settings of C by kind, once, before any work: at_least_1 (counts, sizes,
    intervals), non_negative, positive, fraction (in [0, 1)), seed (whole, 0..SEED_MAX),
    workers (threads or processes: 0..MAX_WORKERS, the script says what 0 means), between
    {key: (low, high)} (inclusive) and choices {key: allowed values}. dashes=True names them
    --key in messages (argparse options).

    Every int and float setting of C must have a kind here (or be a choice): a number left out
    would reach library code unchecked, so that is a bug in the script, an AssertionError."""
    kinds = {"at_least_1": at_least_1, "non_negative": non_negative, "positive": positive, "fraction": fraction,
             "seed": seed, "workers": workers, "between": between or {}, "choices": choices or {}}
    declared = {key for keys in kinds.values() for key in keys}
    numbers = {k for k, v in vars(C).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert not numbers - declared, f"settings with no declared range (give each a kind in cli.check): " \
                                   f"{', '.join(sorted(numbers - declared))}"
    dash = "--" if dashes else ""
    for key in seed:
        value = getattr(C, key)
        require(isinstance(value, int) and 0 <= value <= SEED_MAX, f"{dash}{key} must be a whole number in "
                f"0..{SEED_MAX} (2**32 - 1, what numpy and torch take), got {value}")
    for key in workers:
        require(0 <= getattr(C, key) <= MAX_WORKERS,
                f"{dash}{key} must be in 0..{MAX_WORKERS} ({os.cpu_count()} cores here), got {getattr(C, key)}")
    for key, (low, high) in kinds["between"].items():
        span = f"{low}..{high}" if isinstance(low, int) and isinstance(high, int) else f"[{low:g}, {high:g}]"
        require(low <= getattr(C, key) <= high, f"{dash}{key} must be in {span}, got {getattr(C, key)}")
    for key in at_least_1:
        require(getattr(C, key) >= 1, f"{dash}{key} must be at least 1, got {getattr(C, key)}")
    for key in non_negative:
        require(getattr(C, key) >= 0, f"{dash}{key} must not be negative, got {getattr(C, key)}")
    for key in positive:
        require(getattr(C, key) > 0, f"{dash}{key} must be positive, got {getattr(C, key)}")
    for key in fraction:
        require(0 <= getattr(C, key) < 1, f"{dash}{key} must be in [0, 1), got {getattr(C, key)}")
    for key, allowed in kinds["choices"].items():
        require(getattr(C, key) in allowed,
                f"{dash}{key} must be one of {', '.join(map(str, allowed))}, got {getattr(C, key)!r}")


# -----------------------------------------------------------------------------
# settings


def coerce(key, value, default):
    """`value` (text from the command line, or a config file's object) as the type of
    `default`, or a ConfigError saying what was expected. Floats must be finite, whole
    numbers within int64, a tuple or list of numbers or strings (plain data: checkpoints keep it)."""
    kind = type(default)
    if isinstance(value, str) and kind is not str:
        text = value.strip()
        try:
            if kind is bool:
                value = {"1": True, "true": True, "yes": True, "on": True,
                         "0": False, "false": False, "no": False, "off": False}[text.lower()]
            elif kind is int:
                number = float(text) if any(c in text for c in ".eE") else int(text)
                value = int(number) if number == int(number) else text
            elif kind is float:
                value = float(text)
            else:
                value = ast.literal_eval(text)  # tuples, lists
        except (ValueError, SyntaxError, KeyError, OverflowError):
            pass
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind in (tuple, list) and isinstance(value, (tuple, list)):
        value = kind(value)
    if type(value) is not kind:
        raise ConfigError(f"{key} expects {kind.__name__} (default {default!r}), got {value!r}")
    if kind in (tuple, list) and any(type(v) not in (bool, int, float, str) for v in value):
        raise ConfigError(f"{key} expects a {kind.__name__} of numbers or strings (default {default!r}), got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if kind is int and abs(value) > INT64:  # torch and numpy would overflow (a traceback deep inside)
        raise ConfigError(f"{key} must be within int64 (at most 2**63 - 1 either way), got {value}")
    return value


def _read_config_file(path):
    """The top-level assignments of a config file; any error in it is one line path:line."""
    if os.path.isdir(path):
        raise ConfigError(f"{path} is a folder, not a config file (a Python file of `key = value` lines)")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found (positional arguments are config files; "
                          "settings are written --key=value)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        scope = {}
        exec(compile(text, path, "exec"), scope)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): a config file is Python source") from None
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: {e.msg}: a config file is Python source, "
                          "one `key = value` a line") from None
    except Exception as e:  # NameError, ImportError, ...: the line of the config file that raised
        line = next((fr.lineno for fr in reversed(traceback.extract_tb(e.__traceback__)) if fr.filename == path), "?")
        raise ConfigError(f"{path}:{line}: {type(e).__name__}: {e}") from None
    return {k: v for k, v in scope.items()
            if not (k.startswith("_") or callable(v) or type(v).__name__ == "module")}


def configure(defaults, argv):
    """Settings from `defaults` (name -> value), overridden in order by each config file in
    argv and each --key=value. Returns (C, given): the settings as attributes, and the set of
    keys a config file or the command line set. --help lists the settings."""
    if "--help" in argv or "-h" in argv:
        doc = sys.modules["__main__"].__doc__ or ""
        print(doc.rstrip() + "\n\nSettings (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
        raise SystemExit(0)
    config, given = dict(defaults), set()
    for arg in argv:
        if arg.startswith("--"):
            key, sep, value = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"{arg!r} must be written --key=value")
            pairs = {key: value}
        else:
            pairs = _read_config_file(arg)
        for key, value in pairs.items():
            if key not in defaults:
                hint = difflib.get_close_matches(key, defaults, n=3)
                hint = f" Did you mean {', '.join(hint)}?" if hint else ""
                raise ConfigError(f"unknown setting {key!r}.{hint} Known settings: {', '.join(sorted(defaults))}")
            config[key] = coerce(key, value, defaults[key])
            given.add(key)
    return SimpleNamespace(**config), given


def config_defaults(namespace):
    """The settings of a script: its module globals of plain types, not starting with _."""
    plain = (int, float, bool, str, tuple, list)
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, plain)}
