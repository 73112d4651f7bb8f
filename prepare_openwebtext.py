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
token counts), written last: a folder with meta.json is complete. Documents end with
<|endoftext|>; a random val_fraction of them is val (when there are too few documents, the
last val_fraction of the tokens). Tokenisation runs in --num_proc processes (Hugging Face
`datasets`), with progress bars; the Hub's files are cached in ~/.cache/huggingface.
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
from tqdm import tqdm

# where each corpus lives on the Hub; join "eot": rows are documents; a string: rows are
# pieces of one text (lines of articles), joined with it
HUB = {
    "openwebtext": dict(path="Skylion007/openwebtext", config=None, split="train", field="text", join="eot"),
    "wikitext2": dict(path="Salesforce/wikitext", config="wikitext-2-raw-v1", split="test", field="text", join=""),
    "lambada": dict(path="EleutherAI/lambada_openai", config="en", split="test", field="text", join="eot"),
    "ptb": dict(path="ptb-text-only/ptb_text_only", config="penn_treebank", split="test", field="sentence",
                join="\n", revision="refs/convert/parquet"),  # the original repository is a loading script
}


class PrepareError(Exception):
    """Something the user has to fix: printed as one line."""


def check_text_file(path):
    """Refuse what is not a non-empty text file, saying what it is instead."""
    if not os.path.isfile(path):
        raise PrepareError(f"{path} is not a file")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head:
        raise PrepareError(f"{path} is empty: there is nothing to prepare")
    if head[:2] == b"\x1f\x8b" or head[:4] in (b"PK\x03\x04", b"BZh9") or head[:6] == b"\xfd7zXZ\x00":
        raise PrepareError(f"{path} is a compressed archive, not text: unpack it first (gunzip, unzip, ...)")
    if b"\x00" in head:
        raise PrepareError(f"{path} holds NUL bytes: a binary file (or UTF-16 text), not UTF-8 text; give a "
                           "text file (UTF-16 converts with iconv -f utf-16 -t utf-8)")


def write_splits(out_dir, counts, fill, meta):
    """Create one uint16 file per split ({split: token count}), let fill({split: memmap}) write
    them, then meta.json. Each file goes through <file>.tmp, renamed into place when complete;
    temp files of an earlier killed run are removed first."""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if name.endswith(".tmp"):
            os.remove(os.path.join(out_dir, name))
    paths = {split: os.path.join(out_dir, f"{split}.bin") for split in counts}
    files = {split: np.memmap(paths[split] + ".tmp", dtype=np.uint16, mode="w+", shape=(n,)) for split, n in counts.items()}
    fill(files)
    for split, f in files.items():
        f.flush()
        os.replace(paths[split] + ".tmp", paths[split])
    meta["splits"] = dict(counts)
    with open(os.path.join(out_dir, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    os.replace(os.path.join(out_dir, "meta.json.tmp"), os.path.join(out_dir, "meta.json"))
    print(f"prepared {out_dir}: " + ", ".join(f"{s}.bin {n:,} tokens" for s, n in counts.items())
          + f" ({meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']:,})")


def load_rows(args):
    """The text as a datasets.Dataset, its text column and how its rows join (see HUB)."""
    import datasets

    if args.input:
        files = sorted(f for pattern in args.input for f in (glob.glob(pattern) or [pattern]))
        kinds = {"json" if f.endswith((".json", ".jsonl")) else "parquet" if f.endswith(".parquet") else "text"
                 for f in files}
        if len(kinds) > 1:
            raise PrepareError(f"--input mixes file kinds ({', '.join(sorted(kinds))}): one kind per call")
        kind = kinds.pop()
        for f in files:
            if kind == "text" or not os.path.isfile(f):
                check_text_file(f)
        if kind == "text":  # one document per file, every character kept
            return datasets.load_dataset("text", data_files=files, split="train", sample_by="document"), "text", "eot"
        ds = datasets.load_dataset(kind, data_files=files, split="train")
        spec = dict(field=args.text_field, join="eot", path=", ".join(files))
    else:
        spec = HUB[args.dataset]
        try:
            ds = datasets.load_dataset(spec["path"], spec["config"], split=spec["split"],
                                       revision=spec.get("revision"), num_proc=args.num_proc if args.num_proc > 1 else None)
        except Exception as e:  # no network and not cached, a moved repository, ...
            raise PrepareError(f"could not load {spec['path']} from the Hugging Face Hub ({type(e).__name__}: "
                               f"{str(e)[:200]}). It downloads once (needs network) into ~/.cache/huggingface; "
                               "or pass the files yourself with --input=<files> (text, jsonl or parquet)") from None
    field = args.text_field if args.input else spec["field"]
    if field not in ds.column_names:
        raise PrepareError(f"{spec['path']} has no column {field!r} (columns: {ds.column_names}): "
                           "name the text column with --text_field")
    return ds, field, spec["join"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="openwebtext", choices=sorted(HUB), help="named corpus on the Hub")
    p.add_argument("--input", action="append", help="local file or glob (repeatable): .txt, .jsonl/.json, .parquet")
    p.add_argument("--name", help="output folder under data_dir (default: the dataset, or the first file's stem)")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--text_field", default="text", help="column holding the text (jsonl / parquet)")
    p.add_argument("--val_fraction", type=float, default=None, help="share kept for val (default 0.0005 for "
                   "OpenWebText, else 0.01)")
    p.add_argument("--seed", type=int, default=2357, help="seed of the document split")
    p.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="tokenizer processes")
    p.add_argument("--force", action="store_true", help="prepare again over an already prepared folder")
    args = p.parse_args(argv)
    name = args.name or (os.path.splitext(os.path.basename(args.input[0]))[0] if args.input else args.dataset)
    out_dir = os.path.join(args.data_dir, name)
    val_fraction = args.val_fraction if args.val_fraction is not None else (
        0.0005 if args.dataset == "openwebtext" and not args.input else 0.01)
    try:
        if not 0 < val_fraction < 1:
            raise PrepareError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
        if os.path.isfile(os.path.join(out_dir, "meta.json")) and not args.force:
            print(f"{out_dir} is already prepared (--force prepares it again, --name=<other> writes elsewhere)")
            return
        ds, field, join = load_rows(args)  # the data first: its errors say how to use local files
        import tiktoken

        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # no network and nothing in tiktoken's cache
            raise PrepareError(f"could not load the GPT-2 tokenizer ({type(e).__name__}): tiktoken downloads it "
                               "once (needs network); set TIKTOKEN_CACHE_DIR to a folder holding its files") from None

        def tokenize(batch):  # rows -> token ids (uint16), a document's last row ends with <|endoftext|>
            texts = batch[field] if join == "eot" else [t + join for t in batch[field]]
            ids = enc.encode_ordinary_batch(texts)
            if join == "eot":
                ids = [row + [enc.eot_token] for row in ids]
            return {"ids": [np.array(row, dtype=np.uint16) for row in ids], "len": [len(row) for row in ids]}

        ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenizing (GPT-2 BPE)",
                    num_proc=args.num_proc if args.num_proc > 1 and len(ds) >= 1000 else None)
        if join != "eot":  # pieces of one text: the stream ends with one <|endoftext|>
            ds = ds.add_item({"ids": [enc.eot_token], "len": 1})
        lens = np.array(ds["len"], dtype=np.int64)  # tokens per row
        total = int(lens.sum())
        if total <= len(lens) * (join == "eot"):
            raise PrepareError(f"{', '.join(args.input or [args.dataset])}: no text in it (only empty documents)")
        # where each row's tokens go: documents to val at random when there are enough of them,
        # else the last val_fraction of the token stream; an evaluation set is written whole
        is_val, cut = None, total
        if args.dataset != "openwebtext" and not args.input:
            counts = {"test": total}
        else:
            n_val = round(len(lens) * val_fraction)
            if join == "eot" and 0 < n_val < len(lens):
                is_val = np.zeros(len(lens), bool)
                is_val[np.random.default_rng(args.seed).permutation(len(lens))[:n_val]] = True
                counts = {"train": total - int(lens[is_val].sum()), "val": int(lens[is_val].sum())}
            else:
                cut = total - max(1, round(total * val_fraction))
                counts = {"train": cut, "val": total - cut}

        def fill(files):
            pos, row, done = 0, 0, dict.fromkeys(files, 0)  # tokens and rows read, tokens written per split
            with tqdm(total=total, desc="writing", unit="tok", unit_scale=True) as bar:
                for table in ds.with_format("arrow").iter(batch_size=4096):
                    flat = table["ids"].combine_chunks().flatten().to_numpy(zero_copy_only=False)  # (tokens,)
                    if is_val is not None:
                        to_val = np.repeat(is_val[row:row + table.num_rows], lens[row:row + table.num_rows])
                    else:
                        to_val = np.arange(pos, pos + len(flat)) >= cut
                    parts = {"train": flat[~to_val], "val": flat[to_val]} if "train" in files else {"test": flat}
                    for split, part in parts.items():
                        files[split][done[split]:done[split] + len(part)] = part
                        done[split] += len(part)
                    pos, row = pos + len(flat), row + table.num_rows
                    bar.update(len(flat))

        meta = dict(dataset=name, tokenizer="gpt2", vocab_size=enc.n_vocab, eot_token=enc.eot_token)
        write_splits(out_dir, counts, fill, meta)
    except PrepareError as e:
        sys.exit(f"prepare_openwebtext.py: {e}")


if __name__ == "__main__":
    main()
