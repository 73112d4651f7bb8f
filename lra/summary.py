"""
Load one Long Range Arena task through lra/data.py and print a summary of its splits (size,
lengths, label counts): a quick check that the data is where the trainer will look.

    python lra/summary.py --task=listops --data_dir=data/lra_gen
    python lra/summary.py --task=text --cache_dir=data/lra_cache
"""

import os
import sys

import numpy as np

if __package__ in (None, ""):  # run as a script: make `lra` and the repo's modules importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lra.data import SPLITS, TASKS, load_split
from nanotost import cli

# -----------------------------------------------------------------------------
task = "listops"  # one of lra.data.TASKS
data_dir = "data/lra_release"  # the unpacked LRA release, or what lra/generate.py wrote
cache_dir = ""  # where tokenised arrays are kept ("" : none)
workers = 1  # processes reading Pathfinder images
hf_text = "stanfordnlp/imdb"  # the Hub dataset of the text task
hf_image = "uoft-cs/cifar10"  # the Hub dataset of the image task
# -----------------------------------------------------------------------------


def main(argv):
    cfg, _ = cli.configure(cli.config_defaults(globals()), argv)
    cli.check(cfg, at_least_1=("workers",), workers=("workers",), choices={"task": tuple(TASKS)})
    for split in SPLITS:
        d = load_split(cfg.task, split, cfg.data_dir, cache_dir=cfg.cache_dir, hf_text=cfg.hf_text,
                       hf_image=cfg.hf_image,
                       workers=cfg.workers)
        lengths = d.inputs[0].lengths()
        print(f"{cfg.task} {split}: {len(d)} examples, length {lengths.min()}-{lengths.max()} "
              f"(mean {lengths.mean():.0f}), label counts {np.bincount(d.labels).tolist()}")


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
