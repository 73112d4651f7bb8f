# ToST-Medium (304M parameters: 24 layers, 16 heads, width 1024; MATH.md §5.2) on OpenWebText with
# the recipe of config/tost_owt.py, except weight decay 0.1 (the released Medium config and the
# paper's text agree). 480 sequences per iteration = batch_size 6 x 80 micro-steps (10 per GPU on 8).
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt_medium.py

out_dir = "out-tost-owt-medium"
wandb_run_name = "tost-medium-owt"
eval_interval = 1000
log_interval = 10
compile = True
tssa_impl = "auto"  # the Triton kernels where they pass their first-call check (CUDA), else the reference

n_layer = 24
n_head = 16
n_embd = 1024
weight_decay = 0.1
batch_size = 6
gradient_accumulation_steps = 80
