# Image (CIFAR-10 as 1024 grey pixels), ToST: the paper's setting (MATH.md §6.4): 8 layers,
# width 64, 8 heads, MLP 128, batch 64, lr 1e-4, 9k warmup then linear decay, no dropout,
# wd 2e-2, 180k steps.
task = "image"
attn = "tssa"
n_layer = 8
n_embd = 64
n_head = 8
mlp_hidden = 128
dropout = 0.0
batch_size = 64
learning_rate = 1e-4
lr_schedule = "linear"
warmup_iters = 9000
weight_decay = 2e-2
max_iters = 180000
eval_interval = 3000
out_dir = "out-lra/image_tost"
