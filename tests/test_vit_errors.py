"""
Bad input to the vision scripts (vit_train.py, vit_inspect.py), class by class: each member of
a class ends in ONE line that starts with the script's name and says what to do, exit code 1,
and nothing written (the folders are listed before and after). Classes: settings (bad values,
config files that do not run), checkpoints of another kind, image folders, resume conflicts,
a non-finite loss; and, across a process boundary, an interrupt and a second run into a
locked out_dir. Every --key a message names is a setting of the script it names.

    python -m pytest -q tests/test_vit_errors.py

In-process through cli.run_cli (the command line's code path without an interpreter
start), except the interrupt / lock test. 35 s alone on a 2-core machine at load average 7 (8 s
of it torch's one-time imports that a full run pays anyway; the subprocess test 17 s).
"""

import os
import re
import signal
import subprocess
import sys
import threading

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never reach for the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from nanotost import atomic, checkpoints, cli, outputs
from nanotost import trainkit as tk  # noqa: E402
import vit_inspect  # noqa: E402
import vit_train  # noqa: E402
from helpers_signals import default_signals  # noqa: E402

try:  # the project's shared check of advice, where the repository has it
    from helpers_advice import assert_advice_exists
except ImportError:
    assert_advice_exists = None

torch.set_num_threads(1)  # tiny models: one thread is fastest, and steady on a shared machine
SCRIPTS = {"vit_train.py": vit_train, "vit_inspect.py": vit_inspect}
# a tiny ToST on 16 x 16 shapes: a step takes milliseconds
TINY = ["--shapes_source_size=16", "--img_size=16", "--patch_size=8", "--n_layer=2", "--n_head=2", "--n_embd=16",
        "--shapes_num_classes=4", "--shapes_train_size=32", "--shapes_val_size=8", "--batch_size=8",
        "--device=cpu", "--dtype=float32", "--num_threads=1", "--log_interval=1"]


def call(script, argv, capsys):
    """run_cli(main, argv) of `script` in this process, as the command line runs it. Returns
    (exit code, stdout, stderr); a message given to sys.exit counts as stderr, exit code 1."""
    argv0, sys.argv = sys.argv, [script]  # run_cli names the script from sys.argv[0]
    try:
        cli.run_cli(SCRIPTS[script].main, list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv0
    out, err = capsys.readouterr()
    if isinstance(code, str):
        code, err = 1, err + code
    return code, out, err


def check_advice(message):
    """Every `--key` names a setting of the script that the message (or the `python X.py`
    command inside it) belongs to, and every script it names exists."""
    script = message.split(":")[0]
    for part in re.split(r"(?=python \S+\.py)", message):
        command = re.match(r"python (\S+\.py)", part)
        owner = command.group(1) if command else script
        for key in re.findall(r"(?<![\w-])--(\w+)", part):
            assert key in SCRIPTS[owner].DEFAULTS, (key, owner, message)
    for name in re.findall(r"(?<![\w/.-])((?:lra/)?\w+\.py)\b", message):
        assert os.path.isfile(os.path.join(REPO, name)), (name, message)
    if assert_advice_exists is not None:
        assert_advice_exists(message)


def listing(*folders):
    """(path, size, mtime) of everything under the folders: what a refusal must leave alone."""
    found = []
    for top in folders:
        for folder, dirs, files in os.walk(top):
            found += [(folder, d) for d in dirs]
            found += [(os.path.join(folder, f), os.path.getsize(os.path.join(folder, f)),
                       os.stat(os.path.join(folder, f)).st_mtime_ns) for f in files]
    return sorted(found, key=str)


def refused(script, argv, words, capsys, watch):
    """`script argv` ends in one line starting with the script's name and holding `words`,
    exit code 1, and leaves the folders `watch` (and the working directory) as they were."""
    before = listing(*watch), sorted(os.listdir(os.getcwd()))
    code, out, err = call(script, argv, capsys)
    assert code == 1, (code, out, err)
    line = err.strip()
    assert "\n" not in line and line.startswith(f"{script}: ") and words in line, line
    assert "Traceback" not in line
    check_advice(line)
    assert (listing(*watch), sorted(os.listdir(os.getcwd()))) == before, "a refusal wrote something"
    return line


def write_pngs(folder, n, size=12, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i:02d}.png"))


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """A tiny ToST trained 2 steps (checkpoint at iters 0 and 2): its out_dir."""
    out = str(tmp_path_factory.mktemp("vit") / "out")
    try:
        vit_train.main(TINY + [f"--out_dir={out}", "--max_iters=2", "--eval_interval=2"])
    finally:  # as run_cli does: the lock goes with the run
        tk.release_out_dir(out)
    return out


# -----------------------------------------------------------------------------
# settings: each refused before anything is read or written


BAD_CONFIGS = {  # file content -> what the line says (with the file's name and line)
    "syntax.py": (b"n_layer = 2\nn_head = = 4\n", ":2: invalid syntax"),
    "undefined.py": (b"n_layer = 2\n\nn_embd = width * 2\n", ":3: NameError: name 'width' is not defined"),
    "latin1.py": (b"# caf\xe9\nn_layer = 2\n", ": not UTF-8 text"),
}


@pytest.mark.parametrize("setting, words", [
    ("--eval_interval=0", "eval_interval must be at least 1, got 0"),
    ("--batch_size=-8", "batch_size must be at least 1, got -8"),
    ("--n_layer=0", "n_layer must be at least 1"),
    ("--max_iters=-1", "max_iters must not be negative"),
    ("--learning_rate=0", "learning_rate must be positive"),
    ("--val_fraction=1.5", "val_fraction must be in [0, 1)"),
    ("--mix_prob=2", "mix_prob must be in [0, 1]"),
    ("--dataset=mnist", "dataset must be one of shapes, folder, cifar10"),
    ("--recipe=deit", "recipe must be one of builtin, paper"),
    ("--init_from=continue", "init_from must be one of scratch, resume, auto, finetune"),
    ("--lr_schedule=step", "lr_schedule must be one of"),
    ("--dtype=float8", "dtype must be auto or one of float32, bfloat16, float16"),
    ("--device=tpu", "device must be auto, cpu, cuda, cuda:N or mps"),
    ("--learning_rate=nan", "learning_rate must be a finite number"),
    ("--mixup=inf", "mixup must be a finite number"),
    ("--max_iters=2.5", "max_iters expects int"),
    ("--crop_scale=(0.5,)", "crop_scale must be two numbers"),
    ("--patch_size=6", "patch_size must be a power of two"),
    ("--img_size=20", "img_size (20) must be divisible by patch_size (8)"),
    ("--n_head=3", "n_embd (16) must be divisible by n_head (3)"),
    ("--shapes_num_classes=1", "shapes_num_classes must be in 2..10"),
    ("--min_lr=1", "min_lr (1.0) must not exceed learning_rate"),
    ("--mixupp=0.5", "unknown setting 'mixupp'. Did you mean mixup"),
    ("--dataset=folder", "dataset='folder' needs --data_dir="),
    ("--init_from=finetune", "init_from='finetune' needs --finetune_from="),
    ("--device=cuda", "no CUDA GPU"),
    *[(name, words) for name, (_, words) in BAD_CONFIGS.items()],
])
def test_vit_train_refuses_bad_settings(setting, words, tmp_path, capsys):
    if setting == "--device=cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: --device=cuda is right here")
    if setting in BAD_CONFIGS:  # a config file (a positional argument) that does not run
        path = tmp_path / setting
        path.write_bytes(BAD_CONFIGS[setting][0])
        setting = str(path)
        words = str(path) + words
    refused("vit_train.py", TINY + [f"--out_dir={tmp_path / 'out'}", setting], words, capsys, [tmp_path])
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("setting, words", [
    ("--n_show=0", "n_show must be at least 1"),
    ("--n_rvar=-3", "n_rvar must be at least 1"),
    ("--batch_size=0", "batch_size must be at least 1"),
    ("--num_threads=-1", "num_threads must be in 0.."),
    ("--layers=1;2", "layers must be layer numbers (like '1,6,12') separated by commas: '1;2' is not one"),
    ("--layers=9", "layers 9 out of range: this model has layers 1..2"),
    ("--device=gpu", "device must be auto, cpu, cuda, cuda:N or mps"),
    ("--images=FILE", "is not a folder: give --images="),
    ("--images=EMPTY", "no image files"),
    ("--images=BROKEN", "BROKEN/a.png as an image (UnidentifiedImageError: cannot identify image file"),
    ("--out_dir=FILE", "is a file, not a folder"),
    ("--ckpt=", "give the checkpoint to inspect: --ckpt="),
    ("--ckpt=MISSING", "no checkpoint at"),
    ("--ckpt_path=x", "unknown setting 'ckpt_path'. Did you mean ckpt"),
    *[(name, words) for name, (_, words) in BAD_CONFIGS.items()],
])
def test_vit_inspect_refuses_bad_settings(setting, words, vit_run, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_text("a picture, they said")
    setting = (setting.replace("FILE", str(tmp_path / "file")).replace("EMPTY", str(tmp_path / "empty"))
               .replace("MISSING", str(tmp_path / "nothing" / "ckpt.pt")).replace("BROKEN", str(tmp_path / "broken")))
    words = words.replace("BROKEN", str(tmp_path / "broken"))
    if setting in BAD_CONFIGS:
        path = tmp_path / setting
        path.write_bytes(BAD_CONFIGS[setting][0].replace(b"n_layer", b"n_show").replace(b"n_head", b"n_rvar"))
        setting, words = str(path), str(path) + words
    argv = [f"--ckpt={vit_run}/ckpt.pt", f"--out_dir={tmp_path / 'pictures'}", "--n_rvar=4", setting]  # the last wins
    refused("vit_inspect.py", argv, words, capsys, [tmp_path, vit_run])


def test_vit_inspect_interrupted_while_drawing_writes_no_picture(vit_run, tmp_path, monkeypatch, capsys):
    """The pictures are drawn in memory and written at the end, each through a temp file: an
    interrupt while drawing (here: in the last figure) leaves the folder empty."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vit_inspect, "rvar_figure", interrupted)
    out = tmp_path / "pictures"
    code, _, err = call("vit_inspect.py", [f"--ckpt={vit_run}", f"--out_dir={out}", "--n_show=1", "--n_rvar=4"], capsys)
    assert code == 130 and err.strip() == "vit_inspect.py: interrupted; nothing was saved", err
    assert not out.exists()


# -----------------------------------------------------------------------------
# a checkpoint of another kind, where a ViT checkpoint is expected


def foreign_checkpoint(folder, kind):
    """A checkpoint as train.py ("language") or lra/train.py ("lra") writes one; "language-old":
    one without the fields this version writes (nanoGPT's layout: no kind, no config)."""
    record = {"model": {}, "iter_num": 10, "config": {"n_layer": 2}}
    if kind == "language-old":
        record["model_args"] = {"vocab_size": 65, "block_size": 32}
    else:
        record.update(kind=kind, model_args={"vocab_size": 65} if kind == "language" else {"max_len": 1000})
    path = os.path.join(folder, "ckpt.pt")
    checkpoints.save_checkpoint(record, path)
    return path


@pytest.mark.parametrize("kind", ["language", "lra", "language-old"])
@pytest.mark.parametrize("use", ["resume", "finetune", "inspect"])
def test_a_checkpoint_of_another_kind_is_refused(use, kind, tmp_path, capsys):
    path = foreign_checkpoint(str(tmp_path / "theirs"), kind)
    if kind == "language-old":
        words = f"{path} was not written by this version of vit_train.py (it lacks kind)"
    else:
        words = f"{path} is a {kind} checkpoint (written by {checkpoints.KIND_MAKER[kind]}), not a vit one"
    if use == "resume":
        argv = TINY + [f"--out_dir={tmp_path / 'theirs'}", "--init_from=resume"]
    elif use == "finetune":
        argv = TINY + [f"--out_dir={tmp_path / 'mine'}", "--init_from=finetune", f"--finetune_from={path}"]
    else:
        argv = [f"--ckpt={path}", f"--out_dir={tmp_path / 'pictures'}"]
    refused("vit_inspect.py" if use == "inspect" else "vit_train.py", argv, words, capsys, [tmp_path])


# -----------------------------------------------------------------------------
# image folders: what is wrong is named before any work


def damage(root, case):
    """A good tree (train/ and val/ of 2 classes, or one tree of 2 classes), then one fault.
    Returns (data_dir, what the line must say)."""
    split = case not in ("too few for val", "one class", "val without train")
    top = os.path.join(root, "data")
    train = os.path.join(top, "train") if split else top
    for k, name in enumerate(("cat", "dog")):
        write_pngs(os.path.join(train, name), 4, seed=k)
        if split:
            write_pngs(os.path.join(top, "val", name), 2, seed=10 + k)
    if case == "corrupt image":
        path = os.path.join(train, "dog", "01.png")
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])  # cut in the middle
        return top, f"{path} is not a readable image (OSError: Truncated File Read): remove it"
    if case == "damaged bytes":
        path = os.path.join(top, "val", "cat", "00.png")
        data = bytearray(open(path, "rb").read())
        data[60:70] = bytes(b ^ 0xFF for b in data[60:70])
        open(path, "wb").write(bytes(data))
        return top, f"{path} is not a readable image (SyntaxError: broken PNG file"
    if case == "float pixels":
        path = os.path.join(train, "cat", "02.tif")
        Image.fromarray(np.random.default_rng(0).random((32, 32), dtype=np.float32)).save(path)
        return top, f"{path} has 32-bit float pixels, which have no standard range"
    if case == "non-image file":
        path = os.path.join(train, "cat", "notes.txt")
        open(path, "w").write("cats are great\n")
        return top, f"{path} is not a readable image (not an image format Pillow knows): remove it"
    if case == "empty class folder":
        os.makedirs(os.path.join(train, "emu"))
        return top, f"class folder {os.path.join(train, 'emu')} holds no images: add some, or remove it"
    if case == "one class":
        for f in os.listdir(os.path.join(top, "dog")):
            os.remove(os.path.join(top, "dog", f))
        os.rmdir(os.path.join(top, "dog"))
        return top, f"{top} holds one class folder (cat); classification needs at least 2"
    if case == "too few for val":  # 4 images x val_fraction 0.1 -> none held out
        return top, "class 'cat' has 4 image(s): val_fraction=0.1 leaves 4 to train and 0 to validate"
    if case == "val class not in train":
        write_pngs(os.path.join(top, "val", "emu"), 2)
        return top, f"{os.path.join(top, 'val')} has classes that {train} lacks: emu"
    if case == "val without train":
        write_pngs(os.path.join(top, "val", "cat"), 2)
        return top, f"{os.path.join(top, 'val')} has no train/ beside it"
    if case == "no class folders":
        for name in ("cat", "dog"):
            for f in os.listdir(os.path.join(train, name)):
                os.rename(os.path.join(train, name, f), os.path.join(train, f"{name}{f}"))
            os.rmdir(os.path.join(train, name))
        return top, f"{train} holds no class folders: expected {train}/<class>/<images>"
    if case == "data_dir is a file":
        open(os.path.join(root, "list.txt"), "w").write("cat/00.png\n")
        return os.path.join(root, "list.txt"), f"data_dir={os.path.join(root, 'list.txt')!r} is a file"
    assert case == "data_dir missing"
    return os.path.join(root, "nowhere"), f"data_dir={os.path.join(root, 'nowhere')!r} does not exist"


@pytest.mark.parametrize("case", ["corrupt image", "damaged bytes", "float pixels", "non-image file", "empty class folder",
                                  "one class", "too few for val", "val class not in train", "val without train",
                                  "no class folders", "data_dir is a file", "data_dir missing"])
def test_image_folder_faults_are_named(case, tmp_path, capsys):
    data_dir, words = damage(str(tmp_path), case)
    refused("vit_train.py", TINY + ["--dataset=folder", f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'out'}"],
            words, capsys, [tmp_path])


def test_a_hub_dataset_offline_names_the_local_ways(tmp_path, capsys):
    refused("vit_train.py", TINY + ["--dataset=cifar10", f"--out_dir={tmp_path / 'out'}"],
            "--dataset=folder --data_dir=<image tree>, or --dataset=shapes", capsys, [tmp_path])


# -----------------------------------------------------------------------------
# resuming and fine-tuning: settings that contradict the checkpoint


@pytest.mark.parametrize("extra, words", [
    (["--init_from=resume", "--n_layer=3"], "was trained with other settings: n_layer=3 (checkpoint: 2)"),
    (["--init_from=resume", "--seed=7", "--attn=softmax"], "attn='softmax' (checkpoint: 'tssa'), seed=7 (checkpoint: 1337)"),
    (["--init_from=resume", "--shapes_num_classes=3"], "classifies 4 classes, dataset 'shapes' has other classes (3)"),
    (["--init_from=auto", "--patch_size=4"], "patch_size=4 (checkpoint: 8)"),
    (["--init_from=scratch"], "already exists and init_from='scratch' would overwrite it"),
    (["--init_from=finetune", "--finetune_from=RUN/ckpt.pt"], "already exists and init_from='finetune' would overwrite"),
    (["--init_from=finetune", "--finetune_from=RUN/ckpt.pt", "--out_dir=NEW", "--n_embd=32"],
     "RUN/ckpt.pt was trained with other settings: n_embd=32 (checkpoint: 16); fine-tuning keeps its architecture"),
    (["--init_from=finetune", "--finetune_from=RUN/nothing.pt", "--out_dir=NEW"], "no checkpoint at RUN/nothing.pt"),
])
def test_resume_and_finetune_conflicts(extra, words, vit_run, tmp_path, capsys):
    extra = [a.replace("RUN", vit_run).replace("NEW", str(tmp_path / "new")) for a in extra]
    refused("vit_train.py", TINY + [f"--out_dir={vit_run}", "--max_iters=4"] + extra, words.replace("RUN", vit_run),
            capsys, [vit_run, tmp_path])


def test_a_finished_run_says_so_and_writes_nothing(vit_run, capsys):
    before = listing(vit_run)
    code, out, err = call("vit_train.py", TINY + [f"--out_dir={vit_run}", "--max_iters=2", "--init_from=resume"], capsys)
    assert code == 0 and err == "", err
    assert f"{vit_run}/ckpt.pt already reached max_iters=2 (iter 2): nothing to do" in out
    check_advice("vit_train.py: " + out.strip())
    assert listing(vit_run) == before


@pytest.mark.parametrize("eval_interval, words", [
    (20, r"training loss \((nan|inf)\) at iter [1-9]\d* \(lr 1e\+30\), stopped before the update"),
    (1, r"validation loss \((nan|inf)\) at iter 1, not saved"),
])
def test_a_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(eval_interval, words, vit_run, tmp_path, capsys):
    """A learning rate of 1e30 throws the weights past float32's range at the first step (iter
    0, finite loss); the next forward is not finite. Without an evaluation in between the
    training loss stops the run before its update; with one (eval_interval=1) the validation
    loss stops it before the broken weights are saved. Either way the iter-0 checkpoint stays."""
    out = str(tmp_path / "out")
    code, _, err = call("vit_train.py", TINY + [f"--out_dir={out}", "--init_from=finetune",
                                               f"--finetune_from={vit_run}/ckpt.pt", "--max_iters=20",
                                               f"--eval_interval={eval_interval}", "--learning_rate=1e30",
                                               "--warmup_iters=0", "--lr_schedule=constant"], capsys)
    line = err.strip()
    assert code == 1 and "\n" not in line, err
    assert re.fullmatch(rf"vit_train\.py: non-finite {words}; {re.escape(out)}/ckpt\.pt is the last good checkpoint\. "
                        r"Try a lower --learning_rate", line), line
    check_advice(line)
    ckpt = checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")
    assert ckpt["iter_num"] == 0 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


# -----------------------------------------------------------------------------
# across processes: an interrupt says what was saved; a second run into a live out_dir refuses


def test_interrupt_names_the_checkpoint_and_a_second_run_refuses_the_locked_out_dir(tmp_path, capsys):
    out = str(tmp_path / "out")
    argv = TINY + [f"--out_dir={out}", "--eval_interval=3"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "vit_train.py"), *argv, "--max_iters=100000"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)  # (the signals' defaults, whatever pytest inherited)
    watchdog = threading.Timer(120, proc.kill)  # a hung run fails the test instead of blocking it
    watchdog.start()
    try:
        saves = (line for line in proc.stdout if line.startswith(f"saved {out}/ckpt.pt"))
        assert next(saves, None) and next(saves, None), f"the run ended early: {proc.wait()} {proc.stderr.read()}"
        # iters 0 and 3 are saved and the run goes on; the same out_dir again: refused (its files
        # change under the live run, so only the working directory is watched)
        refused("vit_train.py", argv + ["--init_from=resume", "--max_iters=100000"],
                f"{out} is in use by another run: wait for it to end, or write this run elsewhere "
                "with --out_dir=<new folder>", capsys, [])
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        stderr = proc.stderr.read().strip()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
    assert code == 130 and "\n" not in stderr, (code, stderr)
    match = re.fullmatch(rf"vit_train\.py: interrupted; {re.escape(out)}/ckpt\.pt holds iter (\d+); continue with the "
                         r"same command and --init_from=resume", stderr)
    assert match, stderr
    check_advice(stderr)
    saved = int(match.group(1))
    assert saved >= 3 and checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")["iter_num"] == saved
    code, stdout, err = call("vit_train.py", argv + ["--init_from=resume", f"--max_iters={saved + 1}"], capsys)
    assert code == 0 and f"resumed from {out}/ckpt.pt at iter {saved}" in stdout, err
    assert checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")["iter_num"] == saved + 1


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_an_interrupt_at_the_checkpoints_rename_names_the_iteration_the_file_holds(tmp_path, monkeypatch, capsys,
                                                                                    before):
    """SIGTERM (Ctrl-C's interrupt) just before or just after the second checkpoint's rename: the line names the
    iteration ckpt.pt holds (the file and what an interrupt says change in one step)."""
    from helpers_signals import interrupt_at_rename
    out = str(tmp_path / "out")
    interrupt_at_rename(monkeypatch, "ckpt.pt", 2, before)
    code, _, err = call("vit_train.py", TINY + [f"--out_dir={out}", "--eval_interval=2", "--max_iters=100",
                                               "--always_save_checkpoint=True"], capsys)
    said = re.fullmatch(r"vit_train\.py: interrupted; \S+ holds iter (\d+); continue with .*", err.strip())
    assert code == 130 and said, err
    assert int(said.group(1)) == checkpoints.load_checkpoint(os.path.join(out, "ckpt.pt"), "vit")["iter_num"] == 2


ONE_SET = [outputs.MANIFEST, "cls_attn_00.png", "inspect.json", "pi_00.png", "rvar.png"]  # an inspection of one image


@pytest.mark.parametrize("fault", ["interrupt", "disk-full", "another-run"])
def test_vit_inspect_a_fault_leaves_the_earlier_pictures_whole(vit_run, tmp_path, monkeypatch, capsys, fault):
    """The pictures are one set (outputs.claim_set): an interrupt or a full disk while the new set is
    written, or another run holding the folder, leave the earlier set as it was (a stale
    pi_02.png included), and the line says so."""
    out = tmp_path / "pictures"
    argv = [f"--ckpt={vit_run}", f"--out_dir={out}", "--n_rvar=4"]
    assert call("vit_inspect.py", argv + ["--n_show=3"], capsys)[0] == 0
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "pi_02.png" in earlier and ".lock" not in earlier
    holder = None
    if fault == "another-run":
        holder = subprocess.Popen([sys.executable, "-c", "import sys; from nanotost import cli, outputs; cli.run_cli(lambda: (outputs.claim_set(sys.argv[1], 'x', "
                                   "'vit_inspect.py'), print('held', flush=True), sys.stdin.read()))", str(out)], cwd=REPO,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=default_signals)
        assert holder.stdout.readline() == "held\n"
    else:
        error = KeyboardInterrupt() if fault == "interrupt" else OSError(28, "No space left on device")
        calls = []
        monkeypatch.setattr(atomic, "keep_owner_and_mode", lambda fd, old: calls.append(old) or (
            len(calls) == 2 and (_ for _ in ()).throw(error)))
    try:
        code, _, err = call("vit_inspect.py", argv + ["--n_show=1"], capsys)
    finally:
        if holder:
            holder.stdin.close()
            holder.wait(timeout=30)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier and sorted(os.listdir(tmp_path)) == ["pictures"]
    assert code == (130 if fault == "interrupt" else 1) and len(err.strip().splitlines()) == 1, err
    assert ("in use by another run" if fault == "another-run" else
            f"nothing was replaced: {out} holds its earlier files, whole") in err, err
    if fault == "interrupt":  # then: the new set, whole, without pi_02.png (once: an inspection costs a second)
        assert call("vit_inspect.py", argv + ["--n_show=1"], capsys)[0] == 0
        assert sorted(p.name for p in out.iterdir()) == ONE_SET


def test_vit_inspect_writes_a_writable_folder_whose_parent_is_read_only(vit_run, tmp_path, monkeypatch, capsys):
    """The pictures' folder can be written, its parent cannot (no folder can be made beside it):
    the new set is written in place (outputs.OutputSet.in_place), the earlier run's pi_02.png gone."""
    out = tmp_path / "pictures"
    argv = [f"--ckpt={vit_run}", f"--out_dir={out}", "--n_rvar=4"]
    assert call("vit_inspect.py", argv + ["--n_show=3"], capsys)[0] == 0
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a: (_ for _ in ()).throw(PermissionError(
        13, "Permission denied", p)) if ".tmp" in os.path.basename(p) else real_mkdir(p, *a))  # (as root: made so)
    code, stdout, err = call("vit_inspect.py", argv + ["--n_show=1"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ONE_SET
