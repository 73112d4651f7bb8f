# The GPT-2 baseline (124M parameters: 12 layers, 12 heads, width 768; softmax attention through
# SDPA, biases, no layer scale) on OpenWebText with nanoGPT's recipe, which the paper's GPT-2
# row follows (MATH.md §6.2: test loss 2.84 vs ToST-Base's 3.20): train.py's defaults except the
# attention, biases, layer scale and weight decay 0.1 (nanoGPT's value).
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_owt.py

out_dir = "out-gpt2-owt"
wandb_run_name = "gpt2-base-owt"
eval_interval = 1000
log_interval = 10
compile = True

attn = "softmax"
bias = True
layer_scale_init = 0.0  # none
weight_decay = 0.1
