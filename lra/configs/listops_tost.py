# ListOps, ToST: the paper's setting (MATH.md §6.4): 6 layers, width 512, 8 heads, MLP 2048,
# batch 64, lr 1e-4 with 3k warmup then inverse-sqrt decay, dropout 0.1, wd 1e-2, 90k steps.
task = "listops"
attn = "tssa"
n_layer = 6
n_embd = 512
n_head = 8
mlp_hidden = 2048
dropout = 0.1
batch_size = 64
learning_rate = 1e-4
lr_schedule = "invsqrt"
warmup_iters = 3000
weight_decay = 1e-2
max_iters = 90000
eval_interval = 1500
out_dir = "out-lra/listops_tost"
