# A CPU-sized ListOps run (not the paper's setting): generated data with the official
# grammar but 50-200 tokens per sequence, a small ToST, 3000 steps. The results table in
# lra/README.md was made with it:
#   python lra/generate.py --task=listops --out_dir=data/listops_mini --n_train=20000 \
#       --n_val=1000 --n_test=1000 --min_len=50 --max_len=200
#   python lra/train.py lra/configs/listops_mini_tost.py
task = "listops"
data_dir = "data/listops_mini"
max_len = 200
pad_multiple = 8
attn = "tssa"
n_layer = 2
n_embd = 64
n_head = 4
mlp_hidden = 128
dropout = 0.1
batch_size = 32
learning_rate = 1e-3
lr_schedule = "linear"
warmup_iters = 200
weight_decay = 1e-2
max_iters = 3000
eval_interval = 500
log_interval = 250
num_threads = 1
out_dir = "out-lra/listops_mini_tost"
