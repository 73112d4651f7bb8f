"""
Prepare token data for train.py: flat uint16 token files plus a small meta.json.

    python prepare_openwebtext.py                          # OpenWebText, GPT-2 BPE -> data/openwebtext/
    python prepare_openwebtext.py --dataset=wikitext2      # evaluation sets of the paper (Table 4):
    python prepare_openwebtext.py --dataset=lambada        #   their test split -> data/<name>/test.bin
    python prepare_openwebtext.py --dataset=ptb
    python prepare_openwebtext.py --dataset=pydocs_char    # embedded corpus (below), characters
    python prepare_openwebtext.py --input=book.txt --name=book --char           # any text file
    python prepare_openwebtext.py --input="shards/*.jsonl" --name=mycorpus      # local corpora, BPE

Output, in <data_dir>/<name>/: train.bin and val.bin (test.bin for evaluation sets), every
token id of the split one after another as uint16, and meta.json (tokenizer, vocabulary,
token counts, where the text came from). train.py reads them with np.memmap.

Sources
- Hugging Face Hub (OpenWebText and the evaluation sets) through `datasets`; the repository,
  config, split and revision can be changed with --hf_path / --hf_config / --hf_split /
  --hf_revision. With no network the script stops at once and says to use local files.
- Local files through `datasets`' own loaders: .txt (and any other extension) as plain text,
  .json / .jsonl and .parquet as one document per row (--text_field, default "text").
- "pydocs_char": the docstrings of the Python standard library this interpreter ships, in a
  fixed order. Every machine with Python has it, so the small CPU configs train with no
  download; train.py prepares it automatically the first time a config asks for it.

Tokenizers: GPT-2 BPE through tiktoken (default; documents end with <|endoftext|>), or
--char, one token per character, the vocabulary being the characters the text uses.
Tokenisation runs in --num_proc processes with a progress bar.

Idempotent: a finished preparation ends by writing meta.json; running the same command again
does nothing, a different command on the same folder stops and asks for --force or --name.
"""

import argparse
import ast
import glob
import hashlib
import json
import os
import socket
import sys
import sysconfig
import tempfile

import numpy as np

DTYPE = np.uint16  # every vocabulary here is below 65536 (GPT-2: 50257)
META = "meta.json"

# Where each named corpus lives on the Hub and how its rows become one token stream:
#   join="eot": rows are documents, each followed by <|endoftext|>;
#   join="concat": rows are pieces of one text (lines of an article), joined with `sep`.
HUB = {
    "openwebtext": dict(path="Skylion007/openwebtext", config=None, split="train", field="text", join="eot"),
    "wikitext2": dict(path="Salesforce/wikitext", config="wikitext-2-raw-v1", split="test", field="text",
                      join="concat", sep=""),  # rows are lines that keep their "\n"
    "lambada": dict(path="EleutherAI/lambada_openai", config="en", split="test", field="text", join="eot"),
    "ptb": dict(path="ptb-text-only/ptb_text_only", config="penn_treebank", split="test", field="sentence",
                join="concat", sep="\n", revision="refs/convert/parquet"),  # the original is a script
}
EVAL_SETS = ("wikitext2", "lambada", "ptb")  # scored only: their split is written whole, not split

TIKTOKEN_HOST = "openaipublic.blob.core.windows.net"
GPT2_FILES = ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
              "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json")
HUB_HOST = "huggingface.co"


class PrepareError(RuntimeError):
    """Something the user has to fix (no network, missing file, settings that clash)."""


# -----------------------------------------------------------------------------
# network: fail fast with a message instead of hanging on a download


def reachable(host, port=443, timeout=3.0):
    """True if a TCP connection to host:port opens within `timeout` seconds. Behind a proxy
    (HTTPS_PROXY set) the direct check says nothing, so it is skipped."""
    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return True
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def tiktoken_cache_dir():
    """Where tiktoken keeps downloaded BPE files (its own rule)."""
    return (os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), "data-gym-cache"))


def gpt2_encoding():
    """tiktoken's GPT-2 BPE; with no network and no cached files, a PrepareError saying how to
    provide them."""
    import tiktoken

    cache = tiktoken_cache_dir()
    cached = all(os.path.isfile(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())) for url in GPT2_FILES)
    if not cached and not reachable(TIKTOKEN_HOST):
        raise PrepareError(
            f"the GPT-2 tokenizer files are not in tiktoken's cache ({cache}) and {TIKTOKEN_HOST} cannot be "
            "reached. Run once on a machine with network (tiktoken downloads them into that folder), then copy "
            "the folder here and point TIKTOKEN_CACHE_DIR at it; or use --char for a character-level tokenizer.")
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' ConnectionError, a corrupt cache file, ...
        raise PrepareError(f"could not load the GPT-2 tokenizer ({type(e).__name__}: {e}). tiktoken caches it in "
                           f"{cache} (set TIKTOKEN_CACHE_DIR to choose the folder); it needs network once.") from e


# -----------------------------------------------------------------------------
# tokenizers: what meta.json stores, and the encode / decode pair train.py and sample.py use


def load_tokenizer(meta):
    """(encode, decode) for the tokenizer a meta.json (or a checkpoint's copy of it) names.
    encode: str -> list[int]; decode: list[int] -> str."""
    if meta["tokenizer"] == "char":
        itos = list(meta["chars"])  # a string: character i is token i
        stoi = {ch: i for i, ch in enumerate(itos)}

        def encode(text):
            missing = sorted(set(text) - stoi.keys())
            if missing:
                raise ValueError(f"characters {''.join(missing)!r} are not in this model's vocabulary "
                                 f"({len(itos)} characters from its training text)")
            return [stoi[ch] for ch in text]

        return encode, lambda ids: "".join(itos[i] for i in ids)
    if meta["tokenizer"] == "gpt2":
        enc = gpt2_encoding()
        return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})), enc.decode
    raise ValueError(f"unknown tokenizer {meta['tokenizer']!r} in meta (expected 'gpt2' or 'char')")


_ENC = None  # one tiktoken Encoding per worker process


def _bpe_rows(batch, field, join, sep):
    """datasets.map function: a batch of rows -> their token ids (uint16) and counts."""
    global _ENC
    if _ENC is None:
        _ENC = gpt2_encoding()
    if join == "eot":  # every row is a document
        ids = [row + [_ENC.eot_token] for row in _ENC.encode_ordinary_batch(batch[field])]
    else:  # rows are pieces of a text; an "eot" column marks the last piece of a document
        ids = _ENC.encode_ordinary_batch([text + sep for text in batch[field]])
        ids = [row + [_ENC.eot_token] if end else row for row, end in zip(ids, batch.get("eot", [False] * len(ids)))]
    return {"ids": [np.asarray(row, dtype=DTYPE) for row in ids], "len": [len(row) for row in ids]}


# -----------------------------------------------------------------------------
# the embedded corpus: docstrings of the Python standard library

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def pydocs_texts(max_chars=4_000_000):
    """Docstrings (modules, classes, functions) of the standard library's .py files, in sorted
    path order, exact duplicates dropped, until max_chars characters. Deterministic for a given
    Python installation; another Python version gives a somewhat different corpus."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    docs, seen, total = [], set(), 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            try:
                tree = ast.parse(f.read())
            except (SyntaxError, ValueError):  # a few files are deliberately broken
                continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc not in seen:
                    seen.add(doc)
                    docs.append(doc)
                    total += len(doc) + 2
                    if total >= max_chars:
                        return docs
    if not docs:
        raise PrepareError(f"found no docstrings under {root}; use --input=<text file> instead")
    return docs


# -----------------------------------------------------------------------------
# loading text


def expand_inputs(patterns):
    files = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern)) or ([pattern] if os.path.isfile(pattern) else [])
        if not matched:
            raise PrepareError(f"--input {pattern!r} matches no file")
        files += matched
    return files


def read_text(path):
    """A text file's whole content (UTF-8), or a PrepareError saying it is not UTF-8 text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path} is not UTF-8 text ({e}); convert it first, e.g. "
                           f"iconv -f latin1 -t utf-8 {path} > converted.txt") from None


def local_kind(files):
    """The datasets loader for a list of files: one kind per call."""
    kinds = {"json" if f.endswith((".json", ".jsonl")) else "parquet" if f.endswith(".parquet") else "text"
             for f in files}
    if len(kinds) > 1:
        raise PrepareError(f"--input mixes file kinds ({', '.join(sorted(kinds))}); prepare one kind per call")
    return kinds.pop()


def load_local(files, field):
    """A datasets.Dataset of the files' text and how its rows join into one stream. Plain text
    keeps every line with its line break (rows concatenate back into the exact file), one
    document per file; json/jsonl/parquet rows are documents."""
    import datasets

    kind = local_kind(files)
    if kind == "text":
        parts = []
        for f in files:  # one file at a time, so that each file can end with <|endoftext|>
            ds = datasets.load_dataset("text", data_files=[f], split="train", sample_by="line", keep_linebreaks=True)
            if len(ds):  # an empty file adds nothing
                parts.append(ds.add_column("eot", [False] * (len(ds) - 1) + [True]))
        if not parts:
            raise PrepareError(f"the input files are empty: {files}")
        ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        return ds, "text", dict(join="concat", sep="")
    ds = datasets.load_dataset(kind, data_files=files, split="train")
    if field not in ds.column_names:
        raise PrepareError(f"the files have no column {field!r} (columns: {ds.column_names}); "
                           "name the text column with --text_field")
    return ds, field, dict(join="eot")


def load_hub(name, args):
    """The named corpus from the Hugging Face Hub, failing fast (with what to do) offline."""
    spec = {**HUB[name], **{k: v for k, v in dict(path=args.hf_path, config=args.hf_config, split=args.hf_split,
                                                     revision=args.hf_revision).items() if v}}
    offline = None  # why only the local cache can be used, if it is so
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        offline = "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    elif not reachable(HUB_HOST):
        os.environ["HF_HUB_OFFLINE"] = "1"  # use the local cache only, no retries against a dead network
        offline = f"there is no network ({HUB_HOST} cannot be reached)"
    import datasets

    try:
        ds = datasets.load_dataset(spec["path"], spec["config"], split=spec["split"], revision=spec.get("revision"),
                                   num_proc=args.num_proc if name == "openwebtext" else None)
    except Exception as e:
        why = f"{offline} and it is not in the local Hugging Face cache" if offline else f"{type(e).__name__}: {e}"
        hint = ("On a machine with network run this command once (the cache is ~/.cache/huggingface, or HF_HOME), "
                "or download the data's files and pass them with --input=<files> (text, jsonl or parquet).")
        if "scripts are no longer supported" in str(e):
            hint = ("This repository still uses a loading script, which datasets>=4 does not run: try "
                    "--hf_revision=refs/convert/parquet (the Hub's parquet export), or pass local files with --input.")
        what = f"{spec['path']!r}" + (f" ({spec['config']})" if spec["config"] else "") + f", split {spec['split']!r}"
        raise PrepareError(f"could not load {what}: {why}. {hint}") from e
    field = args.text_field if args.text_field != "text" else spec["field"]
    if field not in ds.column_names:
        raise PrepareError(f"{spec['path']} has no column {field!r} (columns: {ds.column_names}); "
                           "name the text column with --text_field")
    return ds, field, dict(join=spec["join"], sep=spec.get("sep", "")), spec


# -----------------------------------------------------------------------------
# writing


def split_documents(n_docs, val_fraction, seed):
    """Which documents go to val (a bool per document, a seeded random choice), or None when
    there are too few documents to give val at least one (then the stream's tail is val)."""
    n_val = int(round(n_docs * val_fraction))
    if val_fraction <= 0 or n_val < 1 or n_val >= n_docs:
        return None
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


def stream_val_count(total, val_fraction):
    n_val = int(round(total * val_fraction))
    if not 0 < n_val < total:
        raise PrepareError(f"val_fraction={val_fraction} of {total} tokens leaves an empty split; "
                           "change --val_fraction")
    return n_val


class SplitWriter:
    """Writes tokens into one uint16 file per split, each through a temp file that is renamed
    into place once complete. counts: {split name: number of tokens it will receive}."""

    def __init__(self, out_dir, counts):
        for name, n in counts.items():
            if n <= 0:
                raise PrepareError(f"split {name!r} would be empty (is the input empty? change --val_fraction?)")
        self.paths = {name: os.path.join(out_dir, f"{name}.bin") for name in counts}
        self.files = {name: np.memmap(self.tmp(name), dtype=DTYPE, mode="w+", shape=(n,))
                      for name, n in counts.items()}
        self.pos = dict.fromkeys(counts, 0)

    def tmp(self, name):  # per process: two runs preparing the same folder do not collide
        return f"{self.paths[name]}.tmp{os.getpid()}"

    def write(self, name, tokens):
        self.files[name][self.pos[name]:self.pos[name] + len(tokens)] = tokens
        self.pos[name] += len(tokens)

    def close(self):
        for name, f in self.files.items():
            if self.pos[name] != len(f):
                raise RuntimeError(f"{name}: wrote {self.pos[name]} tokens, expected {len(f)}")
            f.flush()
        self.files.clear()
        for name, path in self.paths.items():
            os.replace(self.tmp(name), path)


def tokenize_bpe(ds, field, join, sep, num_proc):
    """Rows -> token ids with GPT-2 BPE in num_proc processes (datasets shows the progress)."""
    gpt2_encoding()  # fail fast here, not in every worker
    num_proc = max(1, min(num_proc, len(ds) // 64 or 1))
    return ds.map(_bpe_rows, batched=True, batch_size=256, fn_kwargs=dict(field=field, join=join, sep=sep),
                  remove_columns=ds.column_names, num_proc=num_proc if num_proc > 1 else None,
                  desc="tokenizing (GPT-2 BPE)")


def prepare_bpe(ds, field, join_spec, out_dir, *, splits_plan, val_fraction, seed, num_proc):
    """Tokenise a datasets.Dataset with GPT-2 BPE and write its splits in one pass. splits_plan:
    "train/val" (documents split at random when there are enough, else the token stream's tail
    is val) or one split name written whole (evaluation sets). Returns {split: token count}."""
    from tqdm import tqdm

    tokens = tokenize_bpe(ds, field, join_spec["join"], join_spec.get("sep", ""), num_proc)
    lens = tokens.select_columns(["len"]).with_format("arrow")[:]["len"].to_numpy()  # tokens per row
    total = int(lens.sum())
    is_val = cut = None
    if splits_plan != "train/val":
        counts = {splits_plan: total}
    else:
        is_val = split_documents(len(lens), val_fraction, seed) if join_spec["join"] == "eot" else None
        if is_val is not None:
            n_val = int(lens[is_val].sum())
        else:  # one long text: the last val_fraction of its tokens
            n_val = stream_val_count(total, val_fraction)
            cut = total - n_val
        counts = {"train": total - n_val, "val": n_val}
    writer = SplitWriter(out_dir, counts)
    row, pos = 0, 0  # rows and tokens done
    with tqdm(total=total, desc="writing", unit="tok", unit_scale=True, disable=total < 1_000_000) as bar:
        for table in tokens.with_format("arrow").iter(batch_size=4096):
            flat = table["ids"].combine_chunks().flatten().to_numpy(zero_copy_only=False)  # (tokens,)
            n_rows = table.num_rows
            if splits_plan != "train/val":
                writer.write(splits_plan, flat)
            else:
                if is_val is not None:  # each token goes where its document goes
                    to_val = np.repeat(is_val[row:row + n_rows], lens[row:row + n_rows])
                else:
                    to_val = np.arange(pos, pos + len(flat)) >= cut
                writer.write("train", flat[~to_val])
                writer.write("val", flat[to_val])
            row, pos = row + n_rows, pos + len(flat)
            bar.update(len(flat))
    writer.close()
    return counts


def prepare_char(docs, sep, out_dir, *, splits_plan, val_fraction, seed):
    """Character-level: vocabulary = the sorted characters the text uses. docs: list of
    strings joined with `sep` (documents are split at random when there are several).
    Returns ({split: count}, chars)."""
    if splits_plan == "train/val":
        is_val = split_documents(len(docs), val_fraction, seed)
        if is_val is not None:
            texts = {name: sep.join(d for d, v in zip(docs, is_val) if v == want)
                     for name, want in (("train", False), ("val", True))}
        else:
            text = sep.join(docs)
            n_val = stream_val_count(len(text), val_fraction)
            texts = {"train": text[:-n_val], "val": text[-n_val:]}
    else:
        texts = {splits_plan: sep.join(docs)}
    codes = {k: np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32) for k, t in texts.items()}
    vocab = np.unique(np.concatenate(list(codes.values())))  # sorted code points
    if len(vocab) > np.iinfo(DTYPE).max:
        raise PrepareError(f"the text uses {len(vocab)} distinct characters, more than uint16 holds")
    writer = SplitWriter(out_dir, {k: len(c) for k, c in codes.items()})
    for name, c in codes.items():
        writer.write(name, np.searchsorted(vocab, c).astype(DTYPE))
    writer.close()
    return {k: len(c) for k, c in codes.items()}, [chr(c) for c in vocab]


def write_meta(out_dir, meta):
    tmp = os.path.join(out_dir, f"{META}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    os.replace(tmp, os.path.join(out_dir, META))


def read_meta(folder):
    path = os.path.join(folder, META)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def is_complete(folder, meta):
    """Every split file meta.json lists is there with the right size."""
    return all(os.path.isfile(p) and os.path.getsize(p) == n * np.dtype(DTYPE).itemsize
               for p, n in ((os.path.join(folder, f"{s}.bin"), n) for s, n in meta["splits"].items()))


# -----------------------------------------------------------------------------
# main


def plan(args):
    """What a command asks for: (output name, request, input files). The request is stored in
    meta.json; the same request on a prepared folder is a no-op."""
    files = None
    if args.input:
        files = expand_inputs(args.input)
        name = args.name or os.path.splitext(os.path.basename(files[0]))[0] + ("_char" if args.char else "")
        source = dict(kind="local", files=[dict(path=os.path.abspath(f), bytes=os.path.getsize(f),
                                                mtime=int(os.path.getmtime(f))) for f in files])
    elif args.dataset == "pydocs_char":
        args.char = True
        name = args.name or "pydocs_char"
        source = dict(kind="pydocs", stdlib=sysconfig.get_paths()["stdlib"], python=sys.version.split()[0],
                      max_chars=args.max_chars)
    elif args.dataset in HUB:
        name = args.name or args.dataset
        source = dict(kind="hub", dataset=args.dataset, hf_path=args.hf_path, hf_config=args.hf_config,
                      hf_split=args.hf_split, hf_revision=args.hf_revision, text_field=args.text_field)
    else:
        raise PrepareError(f"unknown --dataset {args.dataset!r}: choose from {', '.join([*HUB, 'pydocs_char'])}, "
                           "or give local files with --input")
    splits = "train/val"  # training corpora: a train and a val split
    if args.dataset in EVAL_SETS and not args.input:  # evaluation sets: their one split, whole
        hub_split = args.hf_split or HUB[args.dataset]["split"]
        splits = "val" if hub_split == "validation" else hub_split
    val_fraction = args.val_fraction if args.val_fraction is not None else (
        0.0005 if args.dataset == "openwebtext" and not args.input else 0.1 if args.char else 0.01)
    request = dict(source=source, tokenizer="char" if args.char else "gpt2", splits=splits,
                   val_fraction=val_fraction, seed=args.seed, text_field=args.text_field)
    return name, request, files


def prepare(args):
    """Prepare one dataset as the parsed arguments say; returns its meta dict."""
    name, request, files = plan(args)
    splits_plan, val_fraction = request["splits"], request["val_fraction"]
    source = request["source"]
    out_dir = os.path.join(args.data_dir, name)
    old = read_meta(out_dir)
    if old is not None and not args.force:
        if old.get("request") == request and is_complete(out_dir, old):
            print(f"{out_dir} is already prepared ({', '.join(f'{k}: {v:,}' for k, v in old['splits'].items())} "
                  "tokens); --force redoes it")
            return old
        if old.get("request") != request:
            raise PrepareError(f"{out_dir} was prepared from other settings ({old.get('request')}); "
                               "pass --force to overwrite it or --name=<new name> to write elsewhere")
    os.makedirs(out_dir, exist_ok=True)
    if old is not None:
        os.remove(os.path.join(out_dir, META))  # an interrupted redo must not look finished

    meta = dict(dataset=name, request=request, dtype="uint16")
    if args.char:
        if source["kind"] == "pydocs":
            docs, sep = pydocs_texts(args.max_chars), "\n\n"
        elif source["kind"] == "local" and local_kind(files) == "text":
            docs, sep = [read_text(f) for f in files], ""
        else:  # rows of jsonl / parquet / the Hub: documents, or pieces of one text joined with their sep
            ds, field, join_spec = load_local(files, args.text_field) if args.input else load_hub(args.dataset, args)[:3]
            docs, sep = list(ds[field]), "\n\n" if join_spec["join"] == "eot" else join_spec["sep"]
            if join_spec["join"] == "concat":
                docs, sep = ["".join(d + sep for d in docs)], ""  # one text, as the BPE path joins it
        counts, chars = prepare_char(docs, sep, out_dir, splits_plan=splits_plan, val_fraction=val_fraction,
                                     seed=args.seed)
        meta.update(tokenizer="char", vocab_size=len(chars), chars="".join(chars))
    else:
        enc = gpt2_encoding()
        if args.input:
            ds, field, join_spec = load_local(files, args.text_field)
        else:
            ds, field, join_spec, _ = load_hub(args.dataset, args)
        counts = prepare_bpe(ds, field, join_spec, out_dir, splits_plan=splits_plan, val_fraction=val_fraction,
                             seed=args.seed, num_proc=args.num_proc)
        meta.update(tokenizer="gpt2", vocab_size=enc.n_vocab, eot_token=enc.eot_token)
    meta["splits"] = counts
    write_meta(out_dir, meta)  # last: its presence means the folder is complete
    print(f"prepared {out_dir}: " + ", ".join(f"{k}.bin {v:,} tokens" for k, v in counts.items())
          + f" ({meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']:,})")
    return meta


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples are in the docstring at the top of this file.")
    p.add_argument("--dataset", default="openwebtext", help=f"named corpus: {', '.join([*HUB, 'pydocs_char'])}")
    p.add_argument("--input", action="append", help="local file or glob (repeatable): .txt, .jsonl/.json, .parquet")
    p.add_argument("--name", default=None, help="output folder name under data_dir (default: from dataset/input)")
    p.add_argument("--data_dir", default="data", help="folder that holds one folder per prepared dataset")
    p.add_argument("--char", action="store_true", help="character-level tokenizer instead of GPT-2 BPE")
    p.add_argument("--text_field", default="text", help="column holding the text (jsonl/parquet/hub)")
    p.add_argument("--val_fraction", type=float, default=None,
                   help="share of documents (or of the token stream) kept for val; default 0.0005 for "
                        "OpenWebText, 0.1 for --char, 0.01 otherwise")
    p.add_argument("--seed", type=int, default=2357, help="seed of the document split")
    p.add_argument("--num_proc", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="tokenizer processes")
    p.add_argument("--max_chars", type=int, default=4_000_000, help="pydocs_char: cap on the corpus size")
    p.add_argument("--hf_path", default=None, help="override the Hub repository of --dataset")
    p.add_argument("--hf_config", default=None, help="override the Hub config name")
    p.add_argument("--hf_split", default=None, help="override the Hub split (evaluation sets: test)")
    p.add_argument("--hf_revision", default=None, help="Hub revision, e.g. refs/convert/parquet")
    p.add_argument("--force", action="store_true", help="redo even if the folder is already prepared")
    return p.parse_args(argv)


def main(argv=None):
    try:
        prepare(parse_args(argv))
    except PrepareError as e:
        sys.exit(f"prepare_openwebtext.py: {e}")


if __name__ == "__main__":
    main()
