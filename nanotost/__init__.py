"""
nanotost: the plumbing of the scripts at the top of the repository, which a reader of train.py,
sample.py or vit_train.py need not open (the story is in those scripts and in model.py). Each
module is one concern, and imports only go down the floors below (tests/test_house.py holds the
house to them):

  floor 1  portable        what differs between Linux, macOS and Windows
  floor 2  cli             the settings of every script and the one error path
           lists           a list-valued setting's items (a path with commas is one), quoted in a refusal
  floor 3  atomic          files written whole; the project's own JSON read back
           plots           matplotlib for files
  floor 4  outputs         outputs claimed before any work; folders of outputs replaced as one unit
           ranks           DDP ranks, and how every rank ends (interrupts reach C code)
           devices         the device and dtype, CPU cores, whether the Hugging Face Hub answers
           model_settings  a model's settings: which fields a trainer takes, their ranges, names, types
           forks           the checks that a forker's maths runs everywhere or is refused
           schema          the tests a model's two files share (ckpt.pt, an export's config.json)
  (kernels/ sits here: the fused kernels, above forks, below what loads a model)
  floor 6  checkpoints     checkpoints as data: what each holds, how it is written, read and checked
           textdata        the language data: prepared datasets, tokenizers, preparing one
           vit_data        the images of the ViT trainer and inspector
  floor 7  hub             the Hugging Face Hub layout of an exported model
  floor 8  loading         a trained model for every reader (a checkpoint, an export, a Hub id)
           trainkit        the trainers' plumbing (out_dir, logs, resume, schedule, RNGs, MFU)
           whitebox        what the two white-box tools share
  floor 9  lm_eval_adapter the model for EleutherAI's lm-evaluation-harness

model.py, the maths, is below them all and imports nothing of the project.
"""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's root
