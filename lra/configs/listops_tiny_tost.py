# A minutes-on-a-CPU ListOps check (not the paper's setting): shallow generated trees
# (depth <= 3, up to 5 arguments, more than 10 tokens: at most 37 at that depth), a 2-layer
# ToST, 1000 steps. The same model as the tiny run in lra/test_lra.py (which trains it for
# 200 steps). The "tiny" rows of the results table in lra/README.md are this config at
# --seed=1, 2 and 3:
#   python lra/generate.py --task=listops --out_dir=data/listops_tiny --n_train=2000 \
#       --n_val=400 --n_test=400 --min_len=10 --max_len=60 --max_depth=3 --max_args=5
#   python lra/train.py lra/configs/listops_tiny_tost.py --seed=1
task = "listops"
data_dir = "data/listops_tiny"
cache_dir = ""
max_len = 64
pad_multiple = 8
attn = "tssa"
n_layer = 2
n_embd = 64
n_head = 4
mlp_hidden = 128
dropout = 0.0
batch_size = 32
learning_rate = 4e-3
lr_schedule = "linear"
warmup_iters = 20
weight_decay = 1e-2
max_iters = 1000
eval_interval = 250
log_interval = 250
num_threads = 1
out_dir = "out-lra/listops_tiny_tost"
