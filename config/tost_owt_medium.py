# ToST-Medium (304M parameters: 24 layers, 16 heads, width 1024) on OpenWebText with the recipe
# of config/tost_owt.py (notes §6). 480 sequences per iteration = batch_size 6 x 80 micro-batches
# (10 per GPU on 8).
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt_medium.py

out_dir = "out-tost-owt-medium"
dataset = "openwebtext"
eval_interval = 1000
eval_iters = 200
log_interval = 10
wandb_run_name = "tost-medium-owt"

n_layer = 24
n_head = 16
n_embd = 1024
block_size = 1024
dropout = 0.0
bias = False
attn = "tssa"
layer_scale_init = 1e-5

batch_size = 6
gradient_accumulation_steps = 80
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
