# The GPT-2 baseline (config/gpt2_owt.py: softmax attention through SDPA, biases, no layer scale,
# weight decay 0.1) at a 16K context, the counterpart of config/tost_owt_16k.py: the same
# block_size, batch and accumulation, so both see the same tokens per step. 480 x 1024 = 491,520
# tokens would be 30 sequences of 16,384, which do not divide among 8 GPUs: 32 sequences =
# 524,288 tokens (2^19, +6.7%), batch_size 2 x gradient_accumulation_steps 16 (2 per GPU on 8).
# Attention is quadratic in the context: at 16K it is most of GPT-2's step (SPEED.md).
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_owt_16k.py

out_dir = "out-gpt2-owt-16k"
wandb_run_name = "gpt2-base-owt-16k"
eval_interval = 1000
log_interval = 10
compile = True

attn = "softmax"
bias = True
layer_scale_init = 0.0  # none
weight_decay = 0.1

block_size = 16384
batch_size = 2
gradient_accumulation_steps = 16
chunked_loss = True  # the same loss, without 16K x 50K logits at once
