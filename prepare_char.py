"""
Prepare character-level token data for train.py: the embedded corpus, or any UTF-8 text file.

    python prepare_char.py                                # the embedded corpus -> data/pydocs_char/
    python prepare_char.py --input=book.txt               # -> data/book_char/ (--name to choose)
    python train.py config/pydocs_char_tost.py --dataset=book_char

The embedded corpus is the docstrings of the Python standard library this interpreter ships
(modules, classes, functions, in sorted path order, duplicates dropped, up to 4M characters):
every machine with Python has it, so the small CPU configs train with no download (another
Python version gives a somewhat different corpus). The vocabulary is the sorted characters the
text uses (token i is character i, kept in meta.json). The last 10% of the text is val.
Output and meta.json as prepare_openwebtext.py writes them.
"""

import argparse
import ast
import json
import os
import sys
import sysconfig

import numpy as np

from prepare_openwebtext import PrepareError, check_text_file, write_splits


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
        raise PrepareError(f"found no docstrings under {root}: use --input=<text file>")
    return docs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", help="a UTF-8 text file (default: the embedded corpus)")
    p.add_argument("--name", help="output folder under data_dir (default: pydocs_char, or <file stem>_char)")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--val_fraction", type=float, default=0.1, help="share of the text (its end) kept for val")
    p.add_argument("--force", action="store_true", help="prepare again over an already prepared folder")
    args = p.parse_args(argv)
    name = args.name or (os.path.splitext(os.path.basename(args.input))[0] + "_char" if args.input else "pydocs_char")
    out_dir = os.path.join(args.data_dir, name)
    try:
        if not 0 < args.val_fraction < 1:
            raise PrepareError(f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
        source = (dict(path=os.path.abspath(args.input), bytes=os.path.getsize(args.input),
                       mtime=int(os.path.getmtime(args.input))) if args.input and os.path.isfile(args.input)
                  else dict(stdlib=sysconfig.get_paths()["stdlib"], python=sys.version.split()[0]))
        if os.path.isfile(os.path.join(out_dir, "meta.json")) and not args.force:
            with open(os.path.join(out_dir, "meta.json")) as f:
                if json.load(f).get("source") != source:  # an edited file must not train on its old tokens
                    raise PrepareError(f"{out_dir} was prepared from other text (another file, or an earlier version "
                                       "of this one): --force prepares it again, --name=<other> writes elsewhere")
            print(f"{out_dir} is already prepared (--force prepares it again, --name=<other> writes elsewhere)")
            return
        if args.input:  # one text: its last val_fraction is val
            check_text_file(args.input)
            try:
                with open(args.input, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError as e:
                raise PrepareError(f"{args.input} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                                   "convert it from its encoding first, e.g. iconv -f <encoding> -t utf-8") from None
            n_val = round(len(text) * args.val_fraction)
            if not 0 < n_val < len(text):
                raise PrepareError(f"{args.input} has {len(text)} characters: too few for a train and a val split")
            texts = {"train": text[:-n_val], "val": text[-n_val:]}
        else:  # many documents: a seeded random val_fraction of them is val
            docs = pydocs_docs()
            is_val = np.zeros(len(docs), bool)
            is_val[np.random.default_rng(2357).permutation(len(docs))[:round(len(docs) * args.val_fraction)]] = True
            texts = {split: "\n\n".join(d for d, v in zip(docs, is_val) if v == want)
                     for split, want in (("train", False), ("val", True))}
        codes = {k: np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for k, t in texts.items()}  # code points
        vocab = np.unique(np.concatenate(list(codes.values())))  # sorted
        if len(vocab) > 65535:
            raise PrepareError(f"{args.input} uses {len(vocab):,} distinct characters, more than uint16 token ids hold")

        def fill(files):
            for split, c in codes.items():
                files[split][:] = np.searchsorted(vocab, c)

        counts = {k: len(c) for k, c in codes.items()}
        meta = dict(dataset=name, tokenizer="char", vocab_size=len(vocab), chars="".join(map(chr, vocab)), source=source)
        write_splits(out_dir, counts, fill, meta)
    except PrepareError as e:
        sys.exit(f"prepare_char.py: {e}")


if __name__ == "__main__":
    main()
