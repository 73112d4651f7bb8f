# Pathfinder (32 x 32 = 1024 pixels), ToST: the paper's setting (MATH.md §6.4): 2 layers,
# width 64, 2 heads, MLP 128, post-norm, batch 256, lr 2e-4, 312 warmup steps then linear
# decay, dropout 0.1, no weight decay, 200k steps.
task = "pathfinder"
attn = "tssa"
norm = "post"
n_layer = 2
n_embd = 64
n_head = 2
mlp_hidden = 128
dropout = 0.1
batch_size = 256
learning_rate = 2e-4
lr_schedule = "linear"
warmup_iters = 312
weight_decay = 0.0
max_iters = 200000
eval_interval = 4000
out_dir = "out-lra/pathfinder_tost"
