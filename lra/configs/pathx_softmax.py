# Path-X, softmax Transformer at ToST's parameter budget (MLP 64). NOT in the paper.
task = "pathx"
attn = "softmax"
norm = "post"
n_layer = 2
n_embd = 64
n_head = 2
mlp_hidden = 64
dropout = 0.1
batch_size = 64  # x 4 micro-steps: 256 examples per step, as Pathfinder
gradient_accumulation_steps = 4
learning_rate = 2e-4
lr_schedule = "linear"
warmup_iters = 312
weight_decay = 0.0
max_iters = 200000
eval_interval = 4000
out_dir = "out-lra/pathx_softmax"
