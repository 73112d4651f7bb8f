"""
Prepare GPT-2 BPE token data for train.py: OpenWebText, the paper's evaluation sets, or
local text / jsonl / parquet files. (Character level, and the embedded corpus: prepare_char.py.)

    python prepare_openwebtext.py                                # OpenWebText -> data/openwebtext/
    python prepare_openwebtext.py --dataset=wikitext2            # evaluation sets (paper Table 4):
    python prepare_openwebtext.py --dataset=lambada              #   their test split -> test.bin
    python prepare_openwebtext.py --dataset=ptb
    python prepare_openwebtext.py --input="shards/*.jsonl" --name=mycorpus   # local files

Output in <data_dir>/<name>/: train.bin and val.bin (test.bin for an evaluation set), every
token id of the split one after another as uint16, and meta.json (tokenizer, vocabulary size,
token counts, where the text came from, this command). Documents end with <|endoftext|>; a random
val_fraction of them is val (when there are too few documents, the last val_fraction of the
tokens). Tokenisation runs in --num_proc processes (Hugging Face `datasets`), with progress
bars; the Hub's files are cached in ~/.cache/huggingface.

All or nothing: the folder is written whole beside its place (<data_dir>/.<name>.tmp<pid>) and
renamed into it when complete, so a failed or killed run, --force included, leaves the old
folder as it was (--force needs room for the old and the new data until the swap). The same
command again says "already prepared"; input that changed since (an edited file, another
glob match) is refused: --force prepares it again, --name=<other> writes elsewhere.
Every mistake is one line (cli.run_cli). meta.json keeps the command, which errors about
the data quote; the checks and the writing are nanotost/textdata.py's, shared with prepare_char.py.
"""

import argparse
import glob
import json
import os
import shutil
import sys

import numpy as np
from tqdm import tqdm

from nanotost import atomic, cli, devices
from nanotost import textdata as td


def parser():
    """The command line (one ArgumentParser: its mistakes are one line)."""
    p = cli.ArgumentParser(prog="prepare_openwebtext.py", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help=f"named corpus on the Hub: {', '.join(td.HUB)} (default openwebtext)")
    p.add_argument("--input", action="append", help="local file or glob (repeatable): .txt, .jsonl/.json, .parquet")
    p.add_argument("--name", help="output folder under data_dir (default: the dataset, or the first file's stem)")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--text_field", help="column holding the text of --input jsonl / parquet files (default text)")
    p.add_argument("--val_fraction", type=float, help="share kept for val (default 0.0005 for OpenWebText, else 0.01)")
    p.add_argument("--seed", type=int, default=2357, help="seed of the document split")
    p.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="tokenizer processes")
    p.add_argument("--force", action="store_true", help="prepare again over an already prepared folder")
    return p


def input_files(patterns):
    """The files --input names (each given once, cli.parse_list; globs expanded, sorted, a file two
    globs match taken once) and their kind: "text", "json" or "parquet". Missing files, folders
    and mixed kinds are refused."""
    files = []
    for pattern in cli.parse_list("--input", patterns, what="files or globs", paths=True):
        matched = sorted(glob.glob(pattern))
        if not matched and glob.has_magic(pattern):
            raise cli.UserError(f"--input={pattern} matches no file: check the pattern")
        files += matched or [pattern]
    files = [td.input_copy(f) for f in sorted(set(files))]  # a pipe (<(zcat x.jsonl.gz)): read once, into a temp file
    for f in files:
        if os.path.isdir(f):
            raise cli.UserError(f"{f} is a folder: give the files in it, e.g. --input='{f}/*.jsonl'")
        if not os.path.isfile(f):
            raise cli.UserError(f"{f} not found: check the path given to --input")
    kinds = {"json" if f.endswith((".json", ".jsonl")) else "parquet" if f.endswith(".parquet") else "text"
             for f in files}
    if len(kinds) > 1:
        raise cli.UserError(f"--input mixes file kinds ({', '.join(sorted(kinds))}): prepare one kind per call")
    return files, kinds.pop()


def check_settings(args):
    """Every option, checked before any work (a refusal writes nothing). Resolves the defaults
    that depend on others; returns (the claimed dataset folder, files, kind, source)."""
    if args.dataset is not None and args.dataset not in td.HUB:
        raise cli.UserError(f"unknown --dataset {args.dataset!r}: this script prepares {', '.join(td.HUB)}; "
                            f"your own files go with --input=<files> --name={args.dataset} "
                            "(characters: prepare_char.py --input=<file>)")
    cli.require(not (args.input and args.dataset), "give --dataset or --input, not both")
    args.dataset = args.dataset or "openwebtext"
    evaluation_set = not args.input and args.dataset != "openwebtext"
    cli.require(not (evaluation_set and args.val_fraction is not None),
                f"{args.dataset} is an evaluation set, written whole as test.bin: drop --val_fraction")
    cli.require(args.input or args.text_field is None,
                f"--text_field names the column of --input files; {args.dataset}'s is known: drop it")
    args.text_field = args.text_field or "text"
    if args.val_fraction is None:
        args.val_fraction = 0.0005 if args.dataset == "openwebtext" and not args.input else 0.01
    cli.require(0 < args.val_fraction < 1, f"--val_fraction must be between 0 and 1, got {args.val_fraction}")
    cli.check(args, fraction=("val_fraction",), at_least_1=("num_proc",), workers=("num_proc",), seed=("seed",),
              dashes=True)
    files, kind = input_files(args.input) if args.input else ([], None)
    cli.require(args.name or not any(map(td.is_stream, files)), "--input is a pipe, which has no file name: "
                                                                "give --name=<dataset>")
    if args.name is None:
        args.name = os.path.splitext(os.path.basename(files[0]))[0] if files else args.dataset
    out_set = td.check_destination(args.data_dir, args.name)
    if files:
        source = [td.file_source(f) for f in files]
    else:
        spec = td.HUB[args.dataset]
        source = dict(hub=spec["path"], config=spec["config"], split=spec["split"], revision=spec.get("revision"))
    return out_set, files, kind, source


def check_input_files(files, kind):
    """The content of local files, before `datasets` reads them: not empty, not an archive or a
    binary, UTF-8 (text, jsonl), a parquet file's signature."""
    for f in files:
        if kind == "parquet":
            with open(f, "rb") as fh:
                head = fh.read(4)
            if not head:
                raise cli.UserError(f"{f} is empty: there is nothing to prepare")
            if head != b"PAR1":
                raise cli.UserError(f"{f} is not a parquet file (no PAR1 signature): check the file, or rename it "
                                    "if it holds text or jsonl")
        else:
            td.check_text_file(f)
            td.check_utf8(f)


def _bad_json_record(path, field):
    """Where the first record of a json / jsonl file that has no string `field` is, and why
    (file:line, or file: element N of a JSON array); None if every record is good."""
    with open(path, encoding="utf-8") as f:
        first = f.read(1 << 10).lstrip()[:1]
        f.seek(0)
        if first == "[":
            try:
                records = json.load(f)
            except ValueError as e:
                return f"{path}:{getattr(e, 'lineno', '?')}: not valid JSON ({e}): fix the file"
            numbered = ((f"{path}: element {i}", r) for i, r in enumerate(records if isinstance(records, list) else []))
        else:
            numbered = []
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        numbered.append((f"{path}:{number}", json.loads(line)))
                    except ValueError as e:
                        return f"{path}:{number}: not valid JSON ({str(e).split(':')[0]}): fix or remove that line"
    for where, record in numbered:
        if not isinstance(record, dict):
            return f"{where}: {json.dumps(record)[:40]} is not a JSON object: fix or remove that record"
        if field not in record:
            return (f"{where}: no {field!r} field (its fields: {', '.join(record) or 'none'}): name the text's "
                    "with --text_field, or fix that record")
        if not isinstance(record[field], str):
            return f"{where}: {field!r} is {json.dumps(record[field])[:40]}, not a string: fix or remove that record"
    return None


def _bad_parquet_row(path, field):
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=[field]).column(0) if field in pq.read_schema(path).names else None
    if column is None:
        return f"{path}: no column {field!r} (its columns: {', '.join(pq.read_schema(path).names)}): name the " \
               "text's with --text_field"
    if str(column.type) not in ("string", "large_string"):
        return f"{path}: column {field!r} holds {column.type}, not text: name the text's with --text_field"
    if column.null_count:
        return f"{path}: row {column.is_null().to_pylist().index(True)} of column {field!r} is null, not text: " \
               "fix or remove that row"
    return None


def bad_record(files, kind, field):
    """The first record of local files that is not JSON, or whose text field is missing, null or
    not a string, as "file:line: what: what to do" (None if there is none)."""
    for f in files:
        found = _bad_parquet_row(f, field) if kind == "parquet" else _bad_json_record(f, field)
        if found:
            return found
    return None


def local_cache(args):
    """The folder `datasets` keeps its Arrow copy of local files in: a temp folder beside the
    output (written there anyway, so writable), removed at the end, named by this run's pid (the
    one a killed run left is removed by the next: atomic.remove_dead_temps). Local files need
    no Hugging Face cache, so a read-only home (HF_HOME) does not stop them."""
    os.makedirs(args.data_dir, exist_ok=True)
    prefix = atomic.temp_name(args.data_dir, args.name, "datasets-cache")
    atomic.remove_dead_temps(args.data_dir, prefix)
    cache = os.path.join(args.data_dir, f"{prefix}{os.getpid()}")
    shutil.rmtree(cache, ignore_errors=True)  # (this process's own, from a call that did not end)
    os.makedirs(cache)
    cli.at_end(lambda: shutil.rmtree(cache, ignore_errors=True))
    return cache


def load_rows(args, files, kind):
    """The text as a datasets.Dataset, its text column and how its rows join (see td.HUB)."""
    import datasets

    if files:
        cache = local_cache(args)
        if kind == "text":  # one document per file, every character kept
            return datasets.load_dataset("text", data_files=files, split="train", sample_by="document",
                                         cache_dir=cache), "text", "eot"
        field = args.text_field
        try:
            ds = datasets.load_dataset(kind, data_files=files, split="train", cache_dir=cache)
        except Exception:  # a malformed record: say which; anything else keeps its traceback
            found = bad_record(files, kind, field)
            if found:
                raise cli.UserError(found) from None
            raise
        if field not in ds.column_names:
            raise cli.UserError(f"{', '.join(files)}: no field {field!r} (fields: {', '.join(ds.column_names)}): "
                                "name the text's with --text_field")
        if getattr(ds.features[field], "dtype", None) not in ("string", "large_string") \
                or ds.data.column(field).null_count:
            raise cli.UserError(bad_record(files, kind, field) or f"the {field!r} field of {', '.join(files)} is "
                                "not text throughout: name the text's with --text_field")
        return ds, field, "eot"
    spec = td.HUB[args.dataset]
    online = devices.hub_reachable()  # offline: the cache or nothing, at once (no ~25 s of retries)
    try:
        ds = datasets.load_dataset(spec["path"], spec["config"], split=spec["split"],
                                   revision=spec.get("revision"), num_proc=args.num_proc if args.num_proc > 1 else None)
    except Exception as e:  # no network and not cached, a moved repository, ...
        if isinstance(e, OSError) and e.filename:  # the cache's folder cannot be written: run_cli names it
            raise
        offline = "" if online else "; offline: the Hub was not reached"
        raise cli.UserError(f"could not load {spec['path']} from the Hugging Face Hub ({type(e).__name__}: "
                            f"{' '.join(str(e).split())[:200]}{offline}). It downloads once (needs network) into the "
                            "Hugging Face cache (HF_HOME, default ~/.cache/huggingface); or pass the files yourself "
                            "with --input=<files> (text, jsonl or parquet)") from None
    if spec["field"] not in ds.column_names:
        raise cli.UserError(f"{spec['path']} has no column {spec['field']!r} (columns: {ds.column_names}): "
                            "the Hub copy changed; pass the files yourself with --input=<files> --text_field=<column>")
    return ds, spec["field"], spec["join"]


def main(argv):
    args = parser().parse_args(argv)
    out_set, files, kind, source = check_settings(args)
    if td.already_prepared(out_set, source, args.force):
        return
    check_input_files(files, kind)
    ds, field, join = load_rows(args, files, kind)  # the data first: its errors say how to use local files
    enc = td.gpt2_encoding()

    def tokenize(batch):  # rows -> token ids (uint16), a document's last row ends with <|endoftext|>
        texts = batch[field] if join == "eot" else [t + join for t in batch[field]]
        ids = enc.encode_ordinary_batch(texts)
        if join == "eot":
            ids = [row + [enc.eot_token] for row in ids]
        return {"ids": [np.array(row, dtype=np.uint16) for row in ids], "len": [len(row) for row in ids],
                "has_text": [bool(t.strip()) for t in batch[field]]}  # whether the row holds more than whitespace

    ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenizing (GPT-2 BPE)",
                num_proc=args.num_proc if args.num_proc > 1 and len(ds) >= 1000 else None)
    if not any(ds["has_text"]):  # spaces and line breaks tokenize too: no text is not "no tokens"
        raise cli.UserError(f"{', '.join(files or [args.dataset])}: no text in it (only empty or whitespace "
                            "documents): there is nothing to prepare")
    if join != "eot":  # pieces of one text: the stream ends with one <|endoftext|>
        ds = ds.add_item({"ids": [enc.eot_token], "len": 1, "has_text": False})
    lens = np.array(ds["len"], dtype=np.int64)  # tokens per row
    total = int(lens.sum())
    # where each row's tokens go: documents to val at random when there are enough of them,
    # else the last val_fraction of the token stream; an evaluation set is written whole
    is_val, cut = None, total
    if args.dataset != "openwebtext" and not files:
        counts = {"test": total}
    else:
        n_val = round(len(lens) * args.val_fraction)
        if join == "eot" and 0 < n_val < len(lens):
            is_val = np.zeros(len(lens), bool)
            is_val[np.random.default_rng(args.seed).permutation(len(lens))[:n_val]] = True
            counts = {"train": total - int(lens[is_val].sum()), "val": int(lens[is_val].sum())}
        else:
            cut = total - max(1, round(total * args.val_fraction))
            counts = {"train": cut, "val": total - cut}

    def fill(write):
        pos, row = 0, 0  # tokens and rows read
        with tqdm(total=total, desc="writing", unit="tok", unit_scale=True, disable=None) as bar:  # (a terminal's)
            for table in ds.with_format("arrow").iter(batch_size=4096):
                flat = table["ids"].combine_chunks().flatten().to_numpy(zero_copy_only=False)  # (tokens,)
                if is_val is not None:
                    to_val = np.repeat(is_val[row:row + table.num_rows], lens[row:row + table.num_rows])
                else:
                    to_val = np.arange(pos, pos + len(flat)) >= cut
                parts = {"train": flat[~to_val], "val": flat[to_val]} if "train" in counts else {"test": flat}
                for split, part in parts.items():
                    write(split, part)
                pos, row = pos + len(flat), row + table.num_rows
                bar.update(len(flat))

    meta = dict(dataset=args.name, tokenizer="gpt2", vocab_size=enc.n_vocab, eot_token=enc.eot_token, source=source,
                command=td.command_line("prepare_openwebtext.py", argv))
    td.write_splits(out_set, counts, fill, meta)


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
