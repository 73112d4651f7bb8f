# ToST-Large (655M parameters: 36 layers, 20 heads, width 1280; MATH.md §5.2) on OpenWebText with
# the recipe of config/tost_owt.py, except weight decay 0.1 (the released Large config and the
# paper's text agree). 480 sequences per iteration = batch_size 4 x 120 micro-steps (15 per GPU on 8).
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt_large.py

out_dir = "out-tost-owt-large"
wandb_run_name = "tost-large-owt"
eval_interval = 1000
log_interval = 10
compile = True
tssa_impl = "auto"  # the Triton kernels where they pass their first-call check (CUDA), else the reference

n_layer = 36
n_head = 20
n_embd = 1280
weight_decay = 0.1
batch_size = 4
gradient_accumulation_steps = 120
