"""
The language data: what the scripts that prepare text, train on it, sample from a model and
score it share (prepare_char.py, prepare_openwebtext.py, train.py, sample.py, evaluate.py and
lm_eval_adapter.py). A library: no script here, and it imports none.

A prepared dataset is a folder <data_dir>/<name>/ holding
  <split>.bin  every token id of the split, one after another, as uint16 (train and val; an
               evaluation set has test only)
  meta.json    dataset, tokenizer ("char" or "gpt2"), vocab_size, chars (the characters, token
               i is character i) or eot_token (gpt2), splits {split: tokens}, source (what the
               text came from) and command (the command that prepared it, which every error
               about the data quotes to say how to prepare it again)

Reading:   open_dataset (checked), read_batch (which stops when the files change under a run),
           windows (evaluation), load_tokenizer, gpt2_encoding, tokenizer_info / check_tokenizer,
           load_language_model (a train.py checkpoint, its fields checked; or a folder export.py
           wrote, or its Hub id: hub.from_pretrained), load_reader_model (which a reader's settings
           name: --init_from, --ckpt_path, --out_dir), prompt_text,
           SAMPLING_SETTINGS / check_generation
Decoding:  decoding_differs / check_decoding (prefill + steps against the parallel form: per
           attention, then the model as GPT.generate runs it, its state started over for a new
           prompt), generate_in_parallel (sampling by the parallel form alone)
Writing:   ArgumentParser, command_line, check_destination, input_copy (a pipe read once),
           check_text_file, check_utf8 (UTF-8 and no NUL byte throughout), file_source,
           already_prepared, write_splits (all or nothing)
"""

import codecs
import json
import os
import shlex
import shutil
import stat
import tempfile

import numpy as np
import torch

from nanotost import atomic, cli, outputs

# the corpora prepare_openwebtext.py fetches by name: where each lives on the Hugging Face Hub.
# join "eot": rows are documents; a string: rows are pieces of one text, joined with it
HUB = {
    "openwebtext": dict(path="Skylion007/openwebtext", config=None, split="train", field="text", join="eot"),
    "wikitext2": dict(path="Salesforce/wikitext", config="wikitext-2-raw-v1", split="test", field="text", join=""),
    "lambada": dict(path="EleutherAI/lambada_openai", config="en", split="test", field="text", join="eot"),
    "ptb": dict(path="ptb-text-only/ptb_text_only", config="penn_treebank", split="test", field="sentence",
                join="\n", revision="refs/convert/parquet"),  # the original repository is a loading script
}
SPLIT_FILES = ("meta.json", "train.bin", "val.bin", "test.bin")  # what a prepared folder holds
TOKENIZER_KEYS = ("dataset", "tokenizer", "vocab_size", "chars", "eot_token")  # what a checkpoint keeps
TOKENIZERS = ("char", "gpt2")  # the tokenizers a checkpoint may name (load_tokenizer)

# -----------------------------------------------------------------------------
# reading a prepared dataset


def guess_command(dataset, force=""):
    """How a dataset of this name is prepared, for a folder whose meta.json cannot say."""
    if dataset == "pydocs_char":
        return "python prepare_char.py" + force
    if dataset in HUB:
        return f"python prepare_openwebtext.py --dataset={dataset}" + force
    return (f"python prepare_char.py --input=<text file> --name={dataset}{force} "
            f"(or prepare_openwebtext.py --input=<files> --name={dataset}{force})")


def open_dataset(data_dir, dataset, splits, min_tokens):
    """meta.json and the given splits of <data_dir>/<dataset>, checked: each split is there,
    with the size meta.json records and more than min_tokens tokens. Returns (folder, meta);
    meta["redo"] is the command that prepares it again (quoted from meta.json), for the errors
    of whoever reads the tokens later. Any damage is one line with that command."""
    folder = os.path.join(data_dir, dataset)
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        raise cli.UserError(f"dataset {dataset!r} is not prepared ({path} is missing): run {guess_command(dataset)}")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        meta["vocab_size"], meta["tokenizer"], meta["splits"].items(), meta["command"]  # noqa: B018 (must be there)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise cli.UserError(f"{path} is damaged ({type(e).__name__}: {e}): prepare it again: "
                            f"{guess_command(dataset, ' --force')}") from None
    meta["redo"] = meta["command"] + " --force"
    names = ["meta.json"] + [f"{split}.bin" for split in splits]
    meta["stamp"] = {name: file_stamp(os.path.join(folder, name)) for name in names}  # check_unchanged compares
    for split in splits:
        path = os.path.join(folder, f"{split}.bin")
        if split not in meta["splits"]:
            raise cli.UserError(f"dataset {dataset!r} has no {split} split (it has: {', '.join(meta['splits'])})")
        expected, size = meta["splits"][split], os.path.getsize(path) if os.path.isfile(path) else None
        if size != 2 * expected:
            what = "missing" if size is None else f"{size:,} bytes where meta.json says {expected:,} uint16 tokens"
            raise cli.UserError(f"{path} is {what}: prepare it again: {meta['redo']}")
        cli.require(expected > min_tokens, f"{path} has {expected:,} tokens, not more than block_size "
                                           f"({min_tokens:,}): lower --block_size or prepare more text")
    return folder, meta


def file_stamp(path):
    """What changes when a file is replaced or edited: (inode, size, modification time), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_unchanged(folder, split, meta):
    """Stop a run whose data changed since open_dataset (prepared again with --force, say: a
    new vocabulary under the old model), before it reads any of it; say what is left."""
    for name in ("meta.json", f"{split}.bin"):
        if file_stamp(os.path.join(folder, name)) != meta["stamp"][name]:
            raise cli.UserError(f"{os.path.join(folder, name)} changed while this run was reading the data (prepared "
                                f"again?): stopped before reading it; {cli.left_behind()}")


def read_batch(folder, split, starts, T, device, meta):
    """The windows of T + 1 tokens of a split that begin at `starts` (B,) -> x, y (B, T) int64
    on the device, y = x shifted by one. A fresh memory map per call (numpy keeps the pages of a
    long-lived one in memory), of the files open_dataset checked (check_unchanged: two stats);
    token ids outside the vocabulary are a damaged file."""
    check_unchanged(folder, split, meta)
    data = np.memmap(os.path.join(folder, f"{split}.bin"), dtype=np.uint16, mode="r")
    xy = np.stack([data[i:i + T + 1] for i in starts]).astype(np.int64)  # (B, T + 1)
    if xy.max() >= meta["vocab_size"]:  # checked here, on the CPU, at no cost
        raise cli.UserError(f"{folder}/{split}.bin holds token id {xy.max()}, outside the vocabulary "
                            f"({meta['vocab_size']}): prepare it again: {meta['redo']}")
    xy = torch.from_numpy(xy)
    if device.startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)
    return xy[:, :-1], xy[:, 1:]


def windows(n_tokens, T, stride):
    """(start, skip) of windows of up to T tokens that score each of the n_tokens - 1
    predictions of a stream exactly once: a window starts every `stride` tokens and its first
    `skip` predictions were scored by an earlier window (with more context)."""
    out, done, start = [], 0, 0  # predictions [0, done) are scored
    while done < n_tokens - 1:
        out.append((start, done - start))
        done = min(start + T, n_tokens - 1)
        start += stride
    return out


# -----------------------------------------------------------------------------
# tokenizers and models


def load_tokenizer(info):
    """(encode, decode) for the tokenizer a checkpoint (or meta.json) names: "char" (info
    carries the characters, token i is character i) or "gpt2" (tiktoken); another is a UserError."""
    check_tokenizer_named(info)
    if info["tokenizer"] == "char":
        chars = info["chars"]
        stoi = {ch: i for i, ch in enumerate(chars)}

        def encode(text):
            missing = sorted(set(text) - stoi.keys())
            if missing:
                raise cli.UserError(f"the prompt has characters {''.join(missing)!r} that are not in this model's "
                                    f"vocabulary ({len(chars)} characters of its training text)")
            return [stoi[ch] for ch in text]

        return encode, lambda ids: "".join(chars[i] for i in ids)
    enc = gpt2_encoding()
    return (lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})), enc.decode


def gpt2_encoding():
    """tiktoken's GPT-2 BPE; without network and not in tiktoken's cache, one line that says how."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # no network and nothing in tiktoken's cache
        raise cli.UserError(f"could not load the GPT-2 tokenizer ({type(e).__name__}): tiktoken downloads it "
                            "once (needs network); set TIKTOKEN_CACHE_DIR to a folder holding its files") from None


def check_tokenizer_named(info, path="the checkpoint"):
    """Refuse, in one line, a tokenizer this version does not know (a checkpoint of a fork or a later
    version): never taken for another."""
    name = info.get("tokenizer") if isinstance(info, dict) else None
    if name not in TOKENIZERS or (name == "char" and not isinstance(info.get("chars"), str)):
        raise cli.UserError(f"{path} names tokenizer {name!r}, which this version does not know (it reads "
                            f"{', '.join(TOKENIZERS)}, char with its characters): use the version of nanoToST "
                            "that wrote it, or add the tokenizer to textdata.load_tokenizer")


def tokenizer_info(meta):
    """What a checkpoint keeps of meta.json to read and write text: its tokenizer."""
    return {k: meta[k] for k in TOKENIZER_KEYS if k in meta}


def check_tokenizer(ckpt, meta, ckpt_path, dataset, advice):
    """Refuse data tokenized otherwise than the checkpoint's model was trained (`advice`: what to do)."""
    info = ckpt["tokenizer"]
    if (info["tokenizer"], info.get("chars")) != (meta["tokenizer"], meta.get("chars")):
        raise cli.UserError(f"{ckpt_path} was trained with another tokenizer ({info['tokenizer']}, "
                            f"{info.get('dataset')}) than dataset {dataset!r} uses ({meta['tokenizer']}): {advice}")


# -----------------------------------------------------------------------------
# decoding: the recurrent form (a prompt in parallel, then a step per token from the state it
# leaves) against the parallel form; a fork whose two forms differ is told so at the start


# -----------------------------------------------------------------------------
# writing one: the command line, the checks before any work, all-or-nothing writing


def command_line(script, argv):
    """`python <script> <argv>` as one shell line, without --force: what meta.json records as
    the command that prepared the data (its errors add --force to prepare it again)."""
    return shlex.join(["python", script] + [arg for arg in argv if arg != "--force"])


ELSEWHERE = "--name=<other> or --data_dir=<folder>"  # how a preparation writes elsewhere


def check_destination(data_dir, name):
    """Refuse, before any work, a name that is not one folder name, a data_dir that is (or lies
    under) a file, a target that is a file or holds files a preparation did not write, and a
    place that cannot be written. Returns the dataset folder <data_dir>/<name>, claimed: one
    writer at a time, and the way the new data will replace the old known now (outputs.claim_set:
    a swap of folders, or in place where none can be made, e.g. a mount point)."""
    cli.require(name and name not in (".", "..") and os.sep not in name and "/" not in name
                and not name.startswith("."), f"--name must be a plain folder name (no '/', not starting "
                                              f"with '.'), got {name!r}")
    cli.require(data_dir, "--data_dir must not be empty")
    out_dir = os.path.join(data_dir, name)
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise cli.UserError(f"{out_dir} is a file, not a dataset folder: move it, or write elsewhere with "
                            f"{ELSEWHERE}")
    existing = os.path.abspath(data_dir)
    while not os.path.lexists(existing):  # the first part of the path that exists
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise cli.UserError(f"{existing} is a file, so --data_dir={data_dir} cannot be a folder: "
                            "choose another --data_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise cli.UserError(f"{existing} is not writable (permission denied): choose another --data_dir "
                            "or change its permissions")
    return outputs.claim_set(out_dir, ELSEWHERE, "a preparation", legacy=earlier_preparation)


def earlier_preparation(folder):
    """The files of a dataset prepared before sets had manifests: its meta.json and the split
    files it names (none when there is no such meta.json), and the temporary files those
    versions wrote in it (<split>.bin.tmp, which a killed run left)."""
    left = {f"{name}.tmp" for name in SPLIT_FILES if name.endswith(".bin")}
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            splits = json.load(f)["splits"]
    except (OSError, ValueError, TypeError, KeyError):
        return left
    return left | ({"meta.json"} | {f"{split}.bin" for split in splits if f"{split}.bin" in SPLIT_FILES}
                   if isinstance(splits, dict) else set())


_streams = {}  # the temp copy of a pipe -> the pipe's path as given (input_copy)


INPUT_COPIES = "nanotost-input"  # the temp dir's folder of a run's copies of pipes: <this><pid>


def input_copy(path):
    """`path`, or for a pipe or device (--input=<(zcat book.gz), /dev/stdin) a temp copy of what
    it gives, which a preparation can read more than once: in a folder of the temp dir named by
    this run's pid, removed when the script ends (and, where a kill left one, by the next run)."""
    if not is_pipe(path):
        return path
    root = tempfile.gettempdir()
    atomic.remove_dead_temps(root, INPUT_COPIES)
    folder = os.path.join(root, f"{INPUT_COPIES}{os.getpid()}")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        cli.at_end(lambda: shutil.rmtree(folder, ignore_errors=True))
    copy = os.path.join(folder, f"{len(_streams)}{os.path.splitext(path)[1] or '.txt'}")
    with open(copy, "wb") as out, open(path, "rb") as stream:
        shutil.copyfileobj(stream, out, 1 << 20)
    _streams[copy] = path
    return copy


def is_pipe(path):
    """Whether `path` is a pipe or a device (something read once, with no size), not a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # missing: the checks that follow say so
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def is_stream(path):
    """Whether `path` is input_copy's copy of a pipe (it has no name of its own)."""
    return path in _streams


def check_text_file(path):
    """Refuse what is not a non-empty text file, saying what it is instead."""
    shown = _streams.get(path, path)  # a pipe's copy: the pipe as given
    if os.path.isdir(path):
        raise cli.UserError(f"{shown} is a folder, not a text file: give --input a file")
    if not os.path.isfile(path):
        raise cli.UserError(f"{shown} not found: check the path given to --input")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head:
        raise cli.UserError(f"{shown} is empty: there is nothing to prepare")
    if head[:2] == b"\x1f\x8b" or head[:4] in (b"PK\x03\x04", b"BZh9") or head[:6] == b"\xfd7zXZ\x00":
        raise cli.UserError(f"{shown} is a compressed archive, not text: unpack it first (gunzip, unzip, ...)")
    if b"\x00" in head:
        raise cli.UserError(nul_bytes(shown))


def nul_bytes(path, where=""):
    """The refusal of a file holding NUL bytes (`where`: the line and byte of the first)."""
    return (f"{path}{where} holds NUL bytes: a binary file (or UTF-16 text), not UTF-8 text; give a text file "
            "(UTF-16 converts with iconv -f utf-16 -t utf-8)")


def check_utf8(path, chunk=1 << 24):
    """Refuse a file that is not UTF-8 throughout, naming the line and byte of the first fault,
    and one that holds only whitespace (no text to learn from), or a NUL byte anywhere (never text:
    a binary file, or UTF-16, past the head that check_text_file reads). A leading byte-order mark (as some
    editors write) is no text: utf-8-sig drops it here, as prepare_char.py does when it reads."""
    shown = _streams.get(path, path)  # a pipe's copy: the pipe as given
    decoder, offset, lines, blank = codecs.getincrementaldecoder("utf-8-sig")(), 0, 1, True
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                at = offset + max(e.start, 0)
                line = lines + block[:max(e.start, 0)].count(b"\n")
                raise cli.UserError(f"{shown}:{line}: not UTF-8 text (byte {at}: {block[e.start:e.start + 4]!r}); "
                                    "convert it from its encoding first, e.g. iconv -f <encoding> -t utf-8") from None
            if b"\x00" in block:
                at = block.index(b"\x00")
                line = lines + block[:at].count(b"\n")
                raise cli.UserError(nul_bytes(shown, f":{line} (byte {offset + at})"))
            blank = blank and not text.strip()
            if not block:
                break
            offset, lines = offset + len(block), lines + block.count(b"\n")
    if blank:
        raise cli.UserError(f"{shown} holds only whitespace ({offset:,} bytes of spaces, tabs, line breaks or a "
                            "byte-order mark): there is no text to prepare")


def file_source(path):
    """What identifies an input file's content cheaply: its path, size and modification time; for
    a pipe's copy (input_copy), the pipe as given and its content's sha256."""
    st = os.stat(path)
    if path in _streams:
        import hashlib
        with open(path, "rb") as f:
            return dict(stream=_streams[path], bytes=st.st_size, sha256=hashlib.file_digest(f, "sha256").hexdigest())
    return dict(path=os.path.abspath(path), bytes=st.st_size, mtime=int(st.st_mtime))


def already_prepared(out_set, source, force):
    """True when the claimed dataset folder (check_destination) holds a complete preparation of
    `source` (said in one line). A preparation of other input, or a damaged one, is refused
    (without --force: that prepares again)."""
    out_dir = out_set.path
    path = os.path.join(out_dir, "meta.json")
    if force or not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        splits = dict(meta["splits"])
    except (ValueError, KeyError, TypeError) as e:
        raise cli.UserError(f"{path} is damaged ({type(e).__name__}): add --force to prepare it again") from None
    if meta.get("source") != source:  # an edited file must not train on its old tokens
        raise cli.UserError(f"{out_dir} was prepared from other input (another file, or an earlier version of "
                            "this one): --force prepares it again, --name=<other> writes elsewhere")
    for split, n in splits.items():
        bin_path = os.path.join(out_dir, f"{split}.bin")
        size = os.path.getsize(bin_path) if os.path.isfile(bin_path) else None
        if size != 2 * n:
            what = "missing" if size is None else f"{size:,} bytes where meta.json says {n:,} uint16 tokens"
            raise cli.UserError(f"{bin_path} is {what}: add --force to prepare it again")
    print(f"{out_dir} is already prepared (--force prepares it again, --name=<other> writes elsewhere)")
    return True


def write_tokens(f, ids):
    """Append token ids to a split file as uint16."""
    f.write(np.ascontiguousarray(ids, dtype=np.uint16).tobytes())


def write_splits(out_set, counts, fill, meta):
    """Write <split>.bin ({split: token count}) and meta.json into the claimed dataset folder
    (check_destination), all or nothing (outputs.OutputSet: the new data replaces the old whole,
    a failed or killed run leaves the old as it was). A symlink to the folder stays one (the
    folder it points to is replaced), and each file keeps the mode and group of the one it
    replaces. fill(write) writes the tokens, each split in order: write(split, ids)."""
    out_dir = out_set.path
    cli.on_interrupt(f"{out_dir} was left as it was" if out_set.owned else "nothing was written")
    with out_set.writing() as create:
        files = {split: create(f"{split}.bin") for split in counts}
        fill(lambda split, ids: write_tokens(files[split], ids))
        for split, f in files.items():
            if f.tell() != 2 * counts[split]:  # a bug in fill, not the user's doing: a traceback
                raise RuntimeError(f"{split}.bin: {f.tell() // 2} tokens written, {counts[split]} counted")
        meta["splits"] = dict(counts)
        create("meta.json").write(json.dumps(meta, indent=1, ensure_ascii=False).encode("utf-8"))
    cli.on_interrupt(f"{out_dir} holds the new data, whole")
    print(f"prepared {out_dir}: " + ", ".join(f"{s}.bin {n:,} tokens" for s, n in counts.items())
          + f" ({meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']:,})")
