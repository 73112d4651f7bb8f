# ToST-Base (110M parameters: 12 layers, 12 heads, width 768) on OpenWebText with the paper's
# recipe (notes §6): 600k iterations of 480 x 1024 tokens, AdamW lr 6e-4 (betas 0.9, 0.95,
# weight decay 0.1), 2000 warmup iterations, cosine decay to 6e-5, grad clip 1.0, bf16.
# Data: python prepare_openwebtext.py
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt.py
# 480 sequences per iteration = batch_size 12 x gradient_accumulation_steps 40 (5 per GPU on 8).

out_dir = "out-tost-owt"
dataset = "openwebtext"
eval_interval = 1000
eval_iters = 200
log_interval = 10
wandb_run_name = "tost-base-owt"

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
bias = False
attn = "tssa"
layer_scale_init = 1e-5

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
