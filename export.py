"""
Export a training run as a folder in the Hugging Face Hub's layout, to share as it is:

    python export.py --out_dir=out-pydocs-char-tost --to=pydocs-char-tost
    python export.py --out_dir=out-vit-cpu --to=vit-cpu --dtype=bfloat16
    hf upload <you>/pydocs-char-tost pydocs-char-tost        # huggingface_hub's own command
    python sample.py --init_from=<you>/pydocs-char-tost       # or --init_from=pydocs-char-tost

The folder holds model.safetensors (the weights alone, in float32 or --dtype), config.json
(the model's arguments, its tokenizer or its image classes, what the weights are, the nanoToST
commit) and README.md (the model card: data, iterations, tokens seen, val loss from the run's
log, the command that trained it, how to load it); nothing else of the checkpoint (no optimizer,
no RNG states). A train.py or vit_train.py run; the folder is written as one unit, and only a
folder export.py wrote (or a new or empty one) is replaced. Formats and checks: nanotost/hub.py.
"""

import json
import os
import sys

from nanotost import cli, hub, loading, outputs

# -----------------------------------------------------------------------------
out_dir = ""  # the training run: its folder (holding ckpt.pt), or the checkpoint file
to = ""  # the folder to write (a new one, or one export.py wrote)
dtype = "float32"  # of the weights in model.safetensors: "float32" (as trained), "bfloat16" or "float16"
# -----------------------------------------------------------------------------


def main(argv):
    cfg, _ = cli.configure(cli.config_defaults(globals()), argv)
    cli.check(cfg, choices={"dtype": hub.DTYPES})
    cli.require(cfg.out_dir and cfg.to, "give the run and the folder to write: --out_dir=<run> --to=<folder>")
    # before any work: one writer, and only an earlier export replaced (known by its config.json: no manifest beside
    # the three files, which go to the Hub as they are)
    out_set = outputs.claim_set(cfg.to, "--to=<another folder>", "export.py", legacy=hub.exported_files, manifest=False)

    # the run's model and checkpoint, read as every reader reads them
    kind = hub.checkpoint_kind(cfg.out_dir)
    cli.require(kind != "lra", f"{cfg.out_dir} is a Long Range Arena run (lra/train.py), whose models no reader loads "
                               "from a folder: score it with lra/train.py --eval_only; export.py exports train.py "
                               "and vit_train.py runs")
    model, ckpt = (loading.load_language_model(cfg.out_dir, "cpu") if kind == "language" else
                   loading.load_vit_model(cfg.out_dir))
    run_folder = cfg.out_dir if os.path.isdir(cfg.out_dir) else os.path.dirname(os.path.abspath(cfg.out_dir))

    # the three files, written together
    config = hub.describe(model, ckpt, kind, cfg.dtype, run_folder)
    name = os.path.basename(os.path.realpath(cfg.to))
    files = {"config.json": json.dumps(config, indent=1, ensure_ascii=False) + "\n",
             "README.md": hub.model_card(config, ckpt, kind, name),
             "model.safetensors": hub.weights_bytes(model, cfg.dtype)}
    replaced = out_set.replace(files)
    size = len(files["model.safetensors"])
    print(f"wrote {cfg.to}: {config['architecture']}, iteration {ckpt['iter_num']}, {config['parameters']:,} "
          "parameters "
          f"({size:,} bytes of {cfg.dtype} weights), config.json, README.md"
          + (" (replacing the earlier export)" if replaced else ""))
    print(f"load it with --init_from={cfg.to} ({hub.READERS[kind]}); share it: hf upload <you>/{name} {cfg.to}")
    return config


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
