# The GPT-2 baseline (124M parameters: 12 layers, 12 heads, width 768; softmax attention through
# SDPA, biases, no layer scale) on OpenWebText with exactly the recipe of config/tost_owt.py,
# so that the two runs differ only in the attention (notes §6: test loss 2.84 vs 3.20).
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_owt.py

out_dir = "out-gpt2-owt"
dataset = "openwebtext"
eval_interval = 1000
eval_iters = 200
log_interval = 10
wandb_run_name = "gpt2-base-owt"

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = True
attn = "softmax"
layer_scale_init = 0.0  # none

batch_size = 12
gradient_accumulation_steps = 40
learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0

dtype = "bfloat16"
compile = True
