"""
Prepare character-level token data for train.py: the embedded corpus, or any UTF-8 text file.

    python prepare_char.py                                # the embedded corpus -> data/pydocs_char/
    python prepare_char.py --input=book.txt               # -> data/book_char/ (--name to choose)
    python train.py config/pydocs_char_tost.py --dataset=book_char

The embedded corpus is the docstrings of the Python standard library this interpreter ships
(modules, classes, functions, in sorted path order, duplicates dropped, up to 4M characters):
every machine with Python has it, so the small CPU configs train with no download (another
Python version gives a somewhat different corpus). The vocabulary is the sorted characters the
text uses (token i is character i, kept in meta.json). val is --val_fraction (10%): the end of a file, or a
seeded random tenth of the docstrings. Output as nanotost/textdata.py describes it (meta.json keeps the
command, which errors about the data quote), written all or nothing (a failed or killed run,
--force included, leaves the old folder as it was); the same command again says "already
prepared", and an edited --input file is refused (--force prepares it again).
"""

import argparse
import ast
import os
import sys
import sysconfig

import numpy as np

from nanotost import cli
from nanotost import textdata as td


def pydocs_docs(max_chars=4_000_000):
    """The standard library's docstrings, a list of strings."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for folder, dirs, files in os.walk(root):  # folders in sorted order, the test suites left out
        dirs[:] = sorted(d for d in dirs if d not in {"site-packages", "dist-packages", "test", "tests",
                                                      "idle_test", "__pycache__"})
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    docs, seen, total = [], set(), 0
    for path in paths:
        if total >= max_chars:
            break
        with open(path, encoding="utf-8", errors="replace") as f:
            try:
                tree = ast.parse(f.read())
            except (SyntaxError, ValueError):  # a few files are broken on purpose
                continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc not in seen and total < max_chars:
                    seen.add(doc)
                    docs.append(doc)
                    total += len(doc) + 2
    if not docs:
        raise cli.UserError(f"found no docstrings under {root}: use --input=<text file>")
    return docs


def parser():
    """The command line (one ArgumentParser: its mistakes are one line)."""
    p = cli.ArgumentParser(prog="prepare_char.py", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", help="a UTF-8 text file (default: the embedded corpus)")
    p.add_argument("--name", help="output folder under data_dir (default: pydocs_char, or <file stem>_char)")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--val_fraction", type=float, default=0.1, help="share of the text (its end) kept for val")
    p.add_argument("--force", action="store_true", help="prepare again over an already prepared folder")
    return p


def check_settings(args):
    """Every option, checked before any work (a refusal writes nothing). Returns (the claimed
    dataset folder, source)."""
    cli.require(0 < args.val_fraction < 1, f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    cli.check(args, fraction=("val_fraction",), dashes=True)  # (cli.check: every number has a range)
    cli.require(args.input != "", "--input must name a text file (leave it out for the embedded corpus)")
    cli.require(args.name or not args.input or not td.is_pipe(args.input), "--input is a pipe, which has no file "
                                                                          "name: give --name=<dataset>")
    if args.name is None:
        args.name = os.path.splitext(os.path.basename(args.input))[0] + "_char" if args.input else "pydocs_char"
    if args.input and not td.is_pipe(args.input):
        td.check_text_file(args.input)
    out_set = td.check_destination(args.data_dir, args.name)  # (claimed: one writer at a time)
    if args.input and td.is_pipe(args.input):
        args.input = td.input_copy(args.input)  # a pipe (<(zcat book.gz)): read once, into a temp file
        td.check_text_file(args.input)
    source = (td.file_source(args.input) if args.input
              else dict(stdlib=sysconfig.get_paths()["stdlib"], python=sys.version.split()[0]))
    return out_set, source


def read_text(path, val_fraction):
    """One text file: its last val_fraction is val. Returns {split: text}."""
    td.check_utf8(path)
    with open(path, encoding="utf-8-sig") as f:  # without a leading byte-order mark
        text = f.read()
    n_val = round(len(text) * val_fraction)
    if not 0 < n_val < len(text):
        raise cli.UserError(f"{path} has {len(text)} characters: too few for a train and a val split "
                            f"with --val_fraction={val_fraction}")
    return {"train": text[:-n_val], "val": text[-n_val:]}


def main(argv):
    args = parser().parse_args(argv)
    out_set, source = check_settings(args)
    if td.already_prepared(out_set, source, args.force):
        return
    if args.input:
        texts = read_text(args.input, args.val_fraction)
    else:  # many documents: a seeded random val_fraction of them is val
        docs = pydocs_docs()
        is_val = np.zeros(len(docs), bool)
        is_val[np.random.default_rng(2357).permutation(len(docs))[:round(len(docs) * args.val_fraction)]] = True
        texts = {split: "\n\n".join(d for d, v in zip(docs, is_val) if v == want)
                 for split, want in (("train", False), ("val", True))}
    codes = {k: np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for k, t in texts.items()}  # code points
    vocab = np.unique(np.concatenate(list(codes.values())))  # sorted
    if len(vocab) > 65535:
        raise cli.UserError(f"{args.input} uses {len(vocab):,} distinct characters, more than uint16 token ids hold")

    def fill(write):
        for split, c in codes.items():
            write(split, np.searchsorted(vocab, c))

    counts = {k: len(c) for k, c in codes.items()}
    meta = dict(dataset=args.name, tokenizer="char", vocab_size=len(vocab), chars="".join(map(chr, vocab)),
                source=source, command=td.command_line("prepare_char.py", argv))
    td.write_splits(out_set, counts, fill, meta)


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
