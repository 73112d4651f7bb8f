# ToST-Large (655M parameters: 36 layers, 20 heads, width 1280) on OpenWebText with the recipe
# of config/tost_owt.py (notes §6). 480 sequences per iteration = batch_size 4 x 120
# micro-batches (15 per GPU on 8).
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt_large.py

out_dir = "out-tost-owt-large"
dataset = "openwebtext"
eval_interval = 1000
eval_iters = 200
log_interval = 10
wandb_run_name = "tost-large-owt"

n_layer = 36
n_head = 20
n_embd = 1280
block_size = 1024
dropout = 0.0
bias = False
attn = "tssa"
layer_scale_init = 1e-5

batch_size = 4
gradient_accumulation_steps = 120
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
