"""
The one error path and the settings of every script (the trainers, sample.py, evaluate.py,
the preparation scripts, bench.py, lra/, recall/), so that each script reads as its story:

  run_cli     a mistake the user can fix (UserError), a file-system error, a text file that
              is not UTF-8, Ctrl-C / SIGTERM -> one line, exit 1 (130 for an interrupt); real
              bugs keep their traceback (NANOTOST_DEBUG=1: every traceback)
  configure   module globals, then config files, then --key=value (--help lists them)
  check       every setting checked once by kind before any work; require for the rest

    def main(argv):
        C, given = cli.configure(cli.config_defaults(globals()), argv)
        cli.check(C, at_least_1=("max_iters",), choices={"device": ...})
    if __name__ == "__main__":
        cli.run_cli(main, sys.argv[1:])
"""

import ast
import difflib
import errno
import math
import os
import signal
import sys
import traceback
from types import SimpleNamespace

# -----------------------------------------------------------------------------
# one error path


class UserError(Exception):
    """A mistake the person running a script can fix: run_cli prints it as one line."""


class ConfigError(UserError, ValueError):
    """A config file or --key=value that does not fit the script's settings."""


_on_interrupt = ["nothing was saved"]  # what an interrupt leaves behind: scripts update it
_cleanups = []  # what run_cli undoes when the script ends, however it ends (at_end)


def on_interrupt(text):
    """Say what an interrupt now leaves behind (e.g. which checkpoint, how to continue)."""
    _on_interrupt[0] = text


def at_end(undo):
    """Have run_cli call undo() when the script ends, however it ends."""
    _cleanups.append(undo)


def _os_error_line(e):
    what = e.strerror or str(e)
    where = f" {e.filename!r}" if e.filename else ""
    advice = {"ENOSPC": "free some space or write elsewhere", "EACCES": "check its permissions or write elsewhere",
              "EROFS": "write elsewhere", "EISDIR": "give a file, not a folder",
              "ENOTDIR": "a file stands where a folder is expected: move it or choose another path",
              "ENOENT": "check the path"}
    return f"{what}:{where}: {advice.get(errno.errorcode.get(e.errno, ''), 'check the path')}"


def run_cli(main, *args):
    """Run a script's main(*args) for a person at a terminal (see the module docstring)."""
    parts = os.path.normpath(sys.argv[0]).split(os.sep)
    name = "/".join(parts[-2:]) if parts[-2:-1] == ["lra"] else parts[-1]  # train.py, lra/train.py
    if os.environ.get("NANOTOST_DEBUG"):
        return main(*args)
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM (a scheduler, kill) ends as Ctrl-C
    _on_interrupt[0] = "nothing was saved"
    try:
        return main(*args)
    except UserError as e:
        sys.exit(f"{name}: {e}")
    except OSError as e:
        sys.exit(f"{name}: {_os_error_line(e)}")
    except UnicodeDecodeError as e:  # a text file that is not UTF-8 (scripts name the file where they can)
        sys.exit(f"{name}: a file is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                 "convert it first, e.g. iconv -f <encoding> -t utf-8")
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {_on_interrupt[0]}", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, old)
        while _cleanups:  # the run is over, however it ended (e.g. trainkit's out_dir lock)
            _cleanups.pop()()


def require(condition, message):
    """Check a setting: raise ConfigError(message) when `condition` is false."""
    if not condition:
        raise ConfigError(message)


def check(C, *, at_least_1=(), non_negative=(), positive=(), fraction=(), choices=None):
    """Check settings of C by kind: at_least_1 (counts, sizes, intervals), non_negative,
    positive, fraction (in [0, 1)) and choices {key: allowed values}."""
    for key in at_least_1:
        require(getattr(C, key) >= 1, f"{key} must be at least 1, got {getattr(C, key)}")
    for key in non_negative:
        require(getattr(C, key) >= 0, f"{key} must not be negative, got {getattr(C, key)}")
    for key in positive:
        require(getattr(C, key) > 0, f"{key} must be positive, got {getattr(C, key)}")
    for key in fraction:
        require(0 <= getattr(C, key) < 1, f"{key} must be in [0, 1), got {getattr(C, key)}")
    for key, allowed in (choices or {}).items():
        require(getattr(C, key) in allowed,
                f"{key} must be one of {', '.join(map(str, allowed))}, got {getattr(C, key)!r}")


# -----------------------------------------------------------------------------
# settings


def coerce(key, value, default):
    """`value` (text from the command line, or a config file's object) as the type of
    `default`, or a ConfigError saying what was expected. Floats must be finite."""
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
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
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
