"""
results/benchkit/meta.py: what a report's figures depend on besides the rows (the meta section): the
device, driver and versions, the date and load, the hash of the code the figures depend on
(source_digest), and the commit that code is, found without trusting a copy's .git blindly.

A GPU machine's copy of the tree may carry a stale .git (one that names an older commit), or
none. The code is therefore named by its digest, which any checkout can compute for any commit:

    python -c "from results.benchkit.meta import source_digest; print(source_digest())"           # this tree
    python -c "from results.benchkit.meta import source_digest; print(source_digest('4d110ef'))"  # a commit (git)

and the commit by NANOTOST_COMMIT (checked against the digest where the .git holds it) or by
git's HEAD when HEAD's code is the code here; else by the digest alone (meta's commit_check says
which, and why). A commit found to hold other code (NANOTOST_COMMIT whose digest differs, a HEAD
that is not the code here) is never recorded as the commit measured: meta's commit is then None,
and what was given is kept as commit_given (or git_head).
"""

import hashlib
import os
import subprocess
import sys

import torch

from nanotost import REPO, cli, portable
from results.benchkit.part import now_iso

# the code the figures depend on: these files, and the files of these folders with these endings
DIGEST_FILES = ("bench.py", "model.py", "train.py", "config/tost_owt.py", "config/gpt2_owt.py")
DIGEST_FOLDERS = {"results/benchkit": (".py",), "kernels": (".py", ".c"), "nanotost": (".py",)}


def slug(name):
    """A device name as a file name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split()) or "device"


def _run_text(cmd, cwd=None, timeout=20):
    """stdout of a small command, stripped, or None where it cannot run."""
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_blob(root, commit, name):
    """The bytes of file `name` at `commit`, or None where the commit has no such file."""
    try:
        done = subprocess.run(["git", "cat-file", "blob", f"{commit}:{name}"], cwd=root, capture_output=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source_digest(commit=None, root=REPO):
    """sha256 (16 hex digits) over the code that the figures depend on (DIGEST_FILES and the
    DIGEST_FOLDERS' files), as it is in the tree at `root`, or at `commit` (read from git, which
    must hold it): the same hex for the same code, so a report names its code where no git
    checkout travels. The folders' files are hashed in sorted order after the listed ones, each
    as its name and the sha256 of its bytes. (A commit of the layout before nanotost/ and results/ held
    its plumbing and benchkit/ at the top: its digest here is of what it holds under these names, not
    the one its own bench.py recorded, which its report keeps.)"""
    if commit is None:
        found = [f"{folder}/{f}" for folder in DIGEST_FOLDERS if os.path.isdir(os.path.join(root, folder))
                 for f in os.listdir(os.path.join(root, folder)) if not f.startswith(".")]

        def read(name):
            path = os.path.join(root, name)
            if not os.path.isfile(path):
                return None
            with open(path, "rb") as f:
                return f.read()
    else:
        listed = _run_text(["git", "ls-tree", "-r", "--name-only", commit, "--", *DIGEST_FOLDERS], cwd=root)
        cli.require(listed is not None, f"git at {root} does not hold commit {commit!r}")
        found = listed.splitlines()

        def read(name):
            return _git_blob(root, commit, name)
    ours = sorted(n for n in found if os.path.dirname(n) in DIGEST_FOLDERS
                  and n.endswith(DIGEST_FOLDERS[os.path.dirname(n)]))
    h = hashlib.sha256()
    for name in list(DIGEST_FILES) + ours:
        data = read(name)
        if data is not None:
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def given_commit():
    """NANOTOST_COMMIT, when set: a commit's 40 hex digits (an unexpanded `$(git rev-parse HEAD)`,
    a branch name, a short hash: refused in one line before any work); else None."""
    given = os.environ.get("NANOTOST_COMMIT")
    if given is None:
        return None
    cli.require(len(given) == 40 and all(c in "0123456789abcdef" for c in given.lower()),
                f"NANOTOST_COMMIT={given!r} is not a commit (40 hex digits): set it to what `git rev-parse HEAD` "
                "prints, or unset it (the checkout's own git then names the commit)")
    return given.lower()


def name_commit(root, digest):
    """The commit whose code is the code here (digest: its source_digest), where that can be
    known: commit (or None), commit_from (NANOTOST_COMMIT, git, or source_sha256: the digest
    alone), commit_check (how it was checked, in words), dirty (git's uncommitted changes, where
    a .git is at hand). A .git that does not hold the given commit, or whose HEAD is other code
    (a stale copy), is said, never an error: the digest names the code either way."""
    given = given_commit()
    has_git = os.path.exists(os.path.join(root, ".git")) and _run_text(["git", "--version"]) is not None
    head = _run_text(["git", "rev-parse", "HEAD"], cwd=root) if has_git else None
    dirty = bool(_run_text(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)) if head else None

    def digest_at(commit):  # None where this .git does not hold the commit
        known = has_git and _run_text(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root) is not None
        return source_digest(commit, root) if known else None
    if given:
        theirs = digest_at(given)
        if theirs is not None and theirs != digest:  # other code: never recorded as the commit measured
            return dict(commit=None, commit_from="source_sha256", commit_given=given, dirty=dirty,
                        commit_check=f"DIFFERS: NANOTOST_COMMIT {given[:10]} has source_sha256 {theirs}, the code "
                                     f"here {digest}: not that commit, so no commit is recorded (source_sha256 "
                                     "names the code)")
        check = ("its code is the code here (the same source_sha256)" if theirs == digest else
                 "UNVERIFIED: the .git here does not hold it (a stale copy, or none); source_sha256 names the code")
        return dict(commit=given, commit_from="NANOTOST_COMMIT", commit_check=check, dirty=dirty)
    if head:
        theirs = digest_at(head)
        if theirs == digest:
            return dict(commit=head, commit_from="git", commit_check="git's HEAD, whose code is the code here",
                        dirty=dirty)
        return dict(commit=None, commit_from="source_sha256", git_head=head, dirty=dirty,
                    commit_check=f"git's HEAD {head[:10]} holds other code (source_sha256 {theirs}): uncommitted "
                                 "changes or a stale .git; source_sha256 names the code")
    return dict(commit=None, commit_from="source_sha256", dirty=None,
                commit_check="no git here: source_sha256 names the code (source_digest(commit) finds it)")


def collect_meta(cfg):
    """What a figure depends on besides the code: device, driver, versions, commit, date, load."""
    cuda = cfg.device.startswith("cuda")
    digest = source_digest()
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 (any import failure: no Triton here)
        triton_version = None
    cpu = None
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    meta = dict(
        date=now_iso(), device=cfg.device, dtype=cfg.dtype, quick=cfg.quick,
        plan="headline" if cfg.headline else "report",
        python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **name_commit(REPO, digest), source_sha256=digest, cpu=cpu, cpu_threads=torch.get_num_threads(),
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        load_average=list(portable.load_average()))
    if cuda:
        props = torch.cuda.get_device_properties(cfg.device)
        driver = _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        meta.update(name=props.name, gpu=props.name, capability=f"{props.major}.{props.minor}",
                    gpu_memory_gib=round(props.total_memory / 2**30, 1), sm_count=props.multi_processor_count,
                    driver=driver.splitlines()[0] if driver else None)
    else:
        meta.update(name="cpu", gpu=None, driver=None)
    meta["slug"] = slug(meta["name"])
    return meta


def section_meta(S):
    S.data["meta"] = collect_meta(S.cfg)
