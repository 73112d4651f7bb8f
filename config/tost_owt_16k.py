# ToST-Base on OpenWebText at a 16K context: config/tost_owt.py's recipe with block_size 16384.
# Tokens per optimizer step stay (nearly) those of the 1K recipe: 480 x 1024 = 491,520 tokens
# would be 30 sequences of 16,384, but 30 micro-batches do not divide among 8 GPUs, so the step
# takes 32 sequences = 524,288 tokens (2^19, +6.7%): batch_size 2 x gradient_accumulation_steps 16
# (2 micro-steps of 2 x 16K tokens per GPU on 8). Everything else is the 1K recipe (learning rate,
# schedule, iterations), so the two runs see about the same tokens per step and in all.
# The windows are 16K tokens of the concatenated corpus: most OpenWebText documents are shorter,
# so a window spans several documents (separated by the end-of-text token), as at 1K.
# The causal position bias and the position embedding grow with block_size (16,384 positions:
# +12.6M parameters of position embedding, +0.2M of position bias).
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt_16k.py
# Speed of a step at 16K, against its GPT-2 counterpart (config/gpt2_owt_16k.py): SPEED.md.

out_dir = "out-tost-owt-16k"
wandb_run_name = "tost-base-owt-16k"
eval_interval = 1000
log_interval = 10
compile = True

block_size = 16384
batch_size = 2
gradient_accumulation_steps = 16
chunked_loss = True  # the same loss, without 16K x 50K logits at once
# The Triton kernels where they pass their first-call check (a CUDA GPU), else model.py's maths
# (compiled: its sums are blocked scans Inductor builds at every batch, model.prefix_sum), with
# one warning (kernels/auto.py).
tssa_impl = "auto"
