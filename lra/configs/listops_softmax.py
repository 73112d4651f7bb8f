# ListOps, softmax Transformer at ToST's parameter budget: the same setting as
# listops_tost.py except the attention, and an MLP of 2048 - 512 = 1536 so that the two
# extra C x C matrices of q/k/v attention are paid for (counts in lra/README.md).
task = "listops"
attn = "softmax"
n_layer = 6
n_embd = 512
n_head = 8
mlp_hidden = 1536
dropout = 0.1
batch_size = 64
learning_rate = 1e-4
lr_schedule = "invsqrt"
warmup_iters = 3000
weight_decay = 1e-2
max_iters = 90000
eval_interval = 1500
out_dir = "out-lra/listops_softmax"
