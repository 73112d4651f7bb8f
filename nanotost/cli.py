"""
The settings and the one error path of every script (the trainers, sample.py, evaluate.py, the
preparation scripts, bench.py, lra/, the studies), so that each script reads as its story:

  run_cli     a mistake the user can fix (UserError), a file-system error (with the file, and
              the variable that moves a package's cache), a text file that is not UTF-8, memory
              that ran out, Ctrl-C / SIGTERM -> one line, exit 1 (130 for an interrupt); real
              bugs keep their traceback (NANOTOST_DEBUG=1: every traceback)
  on_interrupt, at_end  what an interrupt leaves behind, and what the end of a run undoes
  configure   module globals, then config files, then --key=value (--help lists them); whole
              numbers within int64, finite floats
  check       every setting checked once by kind before any work, and every number must have
              a kind (a range); require, unread (a setting given must do something), build
  parse_list  every list-valued setting (names, numbers, key:value pairs): one rule, each item once
  ArgumentParser  argparse whose mistakes are one line too (the preparation scripts)

    def main(argv):
        cfg, given = cli.configure(cli.config_defaults(globals()), argv)
        cli.check(cfg, at_least_1=("max_iters",), seed=("seed",), choices={"device": ...})

and, under the script's __main__ guard, cli.run_cli(main, sys.argv[1:]). Writing files whole and
claiming outputs are atomic.py's and outputs.py's; what differs between Linux, macOS and Windows
is portable.py's.
"""

import argparse
import ast
import collections
import difflib
import errno
import getpass
import math
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import traceback
import warnings
from types import SimpleNamespace

from nanotost import REPO, lists, portable

# -----------------------------------------------------------------------------
# one error path


class UserError(Exception):
    """A mistake the person running a script can fix: run_cli prints it as one line."""


class ConfigError(UserError, ValueError):
    """A config file or --key=value that does not fit the script's settings."""


_on_interrupt = ["nothing was saved"]  # what an interrupt leaves behind: scripts update it
_said = [threading.Lock()]  # held by whoever says "interrupted": run_cli, or ranks.interrupts_reach_c's thread
_cleanups = []  # what run_cli undoes when the script ends, however it ends (at_end)


def on_interrupt(text):
    """Say what an interrupt now leaves behind (e.g. which checkpoint, how to continue)."""
    _on_interrupt[0] = text


def left_behind():
    """What the run leaves behind if it ends now (the text of the last on_interrupt)."""
    return _on_interrupt[0]


def first_to_say_interrupted():
    """Whether the caller is the first to say "interrupted" for this run (run_cli, or the helper
    thread of ranks.interrupts_reach_c): the line is said once."""
    return _said[0].acquire(blocking=False)


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
    """How messages name a script: train.py, or lra/train.py, results/recall/suite.py for one in a folder of the
    repository."""
    parts = os.path.normpath(path).split(os.sep)
    for n in (3, 2):  # (results/recall/suite.py, lra/train.py)
        if len(parts) >= n and os.path.isfile(os.path.join(REPO, *parts[-n:])):
            return "/".join(parts[-n:])
    return parts[-1]


def run_cli(main, *args):
    """Run a script's main(*args) for a person at a terminal (see the module docstring)."""
    name = script_name(sys.argv[0])
    if os.environ.get("NANOTOST_DEBUG"):
        return main(*args)
    old = {s: signal.signal(s, signal.default_int_handler)  # SIGTERM (a scheduler, kill) ends as Ctrl-C
           for s in portable.INTERRUPTS if s != signal.SIGINT}
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
        if first_to_say_interrupted():  # (else ranks.interrupts_reach_c's thread said it, and ends the process)
            print(f"{name}: interrupted; {_on_interrupt[0]}", file=sys.stderr)
        sys.exit(130)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        while _cleanups:  # the run is over, however it ended (e.g. trainkit's out_dir lock)
            _cleanups.pop()()


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
    model.GPTConfig's) given as one line (ConfigError): the rule is written once, where it belongs.
    A warning it gives (model.check_pi's) is one line on stderr, each once."""
    try:
        with warnings.catch_warnings(record=True) as said:
            made = make(*args, **kwargs)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for text in dict.fromkeys(" ".join(str(w.message).split()) for w in said):
        print(f"{script_name(sys.argv[0])}: warning: {text}", file=sys.stderr)
    return made


INT64 = 2**63 - 1  # the largest whole number a setting may hold: torch and numpy index with int64
SEED_MAX = 2**32 - 1  # seeds: numpy's legacy seeding (np.random.seed) takes 0..2**32-1, torch takes those too
MAX_WORKERS = max(64, 4 * (os.cpu_count() or 1))  # threads / processes: more only thrash (or crash torch)


ITEMS = {str: "names", int: "whole numbers", float: "numbers"}  # how parse_list's messages name the items


def parse_list(key, text, item=str, allowed=None, pairs=False, what=None, paths=False):
    """The one rule of every list-valued setting of every script: a comma-separated list ("op,
    decode", "1,6", "op:200,decode:100"; a repeated option's values, given as a list), as a list
    of its items, each parsed by `item` (str, int, float, or a function that raises ValueError),
    each one of `allowed` where given, and each given once: an item twice (the same once parsed:
    "1,01"; with pairs, the same key of key:value items, or two without a key) is one line, as
    an empty list or item is. pairs: items are "value" or "key:value", returned as (key or None,
    value). paths: items name files, and one whose name holds commas is one item where it exists
    (lists.split_items). `what` names the items in messages (default: ITEMS[item]); a refusal
    quotes a few items and their count, whatever the length of the list (lists.shown)."""
    what = what or ITEMS.get(item, "values")
    parts = [p.strip() for p in text] if isinstance(text, list) else lists.split_items(str(text), paths)
    if isinstance(text, list):  # (a repeated option's values, shown as given)
        text = " ".join(f"{key}={value}" for value in text)
    given = lists.shown(text, parts)
    choose = "" if allowed is None else f" (choose from {', '.join(map(str, allowed))})"
    require(parts and all(parts), f"{key} must be {what} separated by commas{choose}, got {given}")
    values, written = [], {}  # (written: each item as given, by what it parses to)
    for part in parts:
        name, sep, value = part.rpartition(":") if pairs else ("", "", part)
        try:
            parsed = item(value.strip())
        except (ValueError, TypeError, OverflowError):
            raise ConfigError(f"{key} must be {what} separated by commas: {lists.quoted([part])} is not one, got "
                              f"{given}") from None
        values.append((name.strip() if sep else None, parsed) if pairs else parsed)
        written.setdefault(values[-1][0] if pairs else parsed, (name.strip() if sep else "all") if pairs else part)
    ids = [v[0] for v in values] if pairs else values
    counts = collections.Counter(ids)  # (each item once: counted, not compared with every other)
    twice = [written[v] for v, n in counts.items() if n > 1]
    require(not twice, f"{key} names {lists.few(twice)} more than once: name each once, got {given}")
    unknown = [v for v in ids if allowed is not None and v is not None and v not in allowed]
    if unknown:
        raise ConfigError(f"{key}: unknown {lists.quoted(unknown)}; choose from {', '.join(map(str, allowed))}")
    return values


def name_list(key, text, allowed=None, paths=False):
    """A comma-separated list of names ("op,decode"), each once, each one of `allowed` where given
    (parse_list; paths: names of files, "my,task.yaml" one where it exists)."""
    return parse_list(key, text, allowed=allowed, paths=paths)


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


def check(cfg, *, at_least_1=(), non_negative=(), positive=(), fraction=(), seed=(), workers=(), between=None,
          choices=None, elsewhere=(), dashes=False):
    """Check the settings of cfg by kind, once, before any work: at_least_1 (counts, sizes,
    intervals), non_negative, positive, fraction (in [0, 1)), seed (whole, 0..SEED_MAX),
    workers (threads or processes: 0..MAX_WORKERS, the script says what 0 means), between
    {key: (low, high)} (inclusive) and choices {key: allowed values}; elsewhere: numbers whose
    rules live with the code that takes them (a forker's model field: its config's own rules).
    dashes=True names them --key in messages (argparse options).

    Every int and float setting of cfg must have a kind here (or be a choice): a number left out
    would reach library code unchecked, so that is a bug in the script, an AssertionError."""
    kinds = {"at_least_1": at_least_1, "non_negative": non_negative, "positive": positive, "fraction": fraction,
             "seed": seed, "workers": workers, "between": between or {}, "choices": choices or {},
             "elsewhere": elsewhere}
    declared = {key for keys in kinds.values() for key in keys}
    numbers = {k for k, v in vars(cfg).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert not numbers - declared, f"settings with no declared range (give each a kind in cli.check): " \
                                   f"{', '.join(sorted(numbers - declared))}"
    dash = "--" if dashes else ""
    for key in seed:
        value = getattr(cfg, key)
        require(isinstance(value, int) and 0 <= value <= SEED_MAX, f"{dash}{key} must be a whole number in "
                f"0..{SEED_MAX} (2**32 - 1, what numpy and torch take), got {value}")
    for key in workers:
        require(0 <= getattr(cfg, key) <= MAX_WORKERS,
                f"{dash}{key} must be in 0..{MAX_WORKERS} ({os.cpu_count()} cores here), got {getattr(cfg, key)}")
    for key, (low, high) in kinds["between"].items():
        span = f"{low}..{high}" if isinstance(low, int) and isinstance(high, int) else f"[{low:g}, {high:g}]"
        require(low <= getattr(cfg, key) <= high, f"{dash}{key} must be in {span}, got {getattr(cfg, key)}")
    for key in at_least_1:
        require(getattr(cfg, key) >= 1, f"{dash}{key} must be at least 1, got {getattr(cfg, key)}")
    for key in non_negative:
        require(getattr(cfg, key) >= 0, f"{dash}{key} must not be negative, got {getattr(cfg, key)}")
    for key in positive:
        require(getattr(cfg, key) > 0, f"{dash}{key} must be positive, got {getattr(cfg, key)}")
    for key in fraction:
        require(0 <= getattr(cfg, key) < 1, f"{dash}{key} must be in [0, 1), got {getattr(cfg, key)}")
    for key, allowed in kinds["choices"].items():
        require(getattr(cfg, key) in allowed,
                f"{dash}{key} must be one of {', '.join(map(str, allowed))}, got {getattr(cfg, key)!r}")


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
    argv and each --key=value. Returns (cfg, given): the settings as attributes, and the set of
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UserErrors (one line through run_cli, exit 1) rather than
    a usage block and exit 2; --help still prints the options and exits 0."""

    def error(self, message):
        known = re.findall(r"--\w+", self.format_usage())
        if message.startswith("unrecognized arguments: "):
            given = message.split(": ", 1)[1].split()
            raise UserError(f"unknown option{'s' * (len(given) > 1)} {', '.join(map(repr, given))}; "
                                f"the options: {', '.join(known)} (--help explains them)")
        raise UserError(f"{message} (--help explains the options)")
