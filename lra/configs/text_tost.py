# Text (IMDB, bytes, 4096), ToST: the paper's setting (MATH.md §6.4): 4 layers, width 256,
# 4 heads, MLP 1024, batch 32, lr 1e-4, 10k warmup then linear decay, dropout 0.1,
# wd 1e-2, 25k steps.
task = "text"
attn = "tssa"
n_layer = 4
n_embd = 256
n_head = 4
mlp_hidden = 1024
dropout = 0.1
batch_size = 32
learning_rate = 1e-4
lr_schedule = "linear"
warmup_iters = 10000
weight_decay = 1e-2
max_iters = 25000
eval_interval = 1000
out_dir = "out-lra/text_tost"
