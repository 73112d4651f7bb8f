# ToST-Base (110M parameters) on OpenWebText: train.py's defaults are this recipe, so this file
# lists only what differs from them. Where each recipe value comes from (MATH.md §6.1):
#   paper (MATH.md §6.1): 600k iterations of 480 x 1024 tokens (batch_size 12 x gradient_accumulation_steps
#     40: 5 per GPU on 8), AdamW lr 6e-4, betas (0.9, 0.95), 2000 warmup iterations, cosine decay
#     to 6e-5, grad clip 1.0, bf16 (dtype="auto" picks it on GPUs that have it)
#   paper (MATH.md §5.2): 12 layers, 12 heads, width 768, context 1024, no biases; layer scale init 1e-5
#   released config: weight decay 0.01 for Base (the paper's text says 0.1 for all sizes; the
#     release uses 0.1 for Medium and Large only, and the paper's 3.20 most likely came from 0.01)
#   ours: eval_interval, log_interval, compile, tssa_impl (not part of the recipe)
# Data: python prepare_openwebtext.py
#   torchrun --standalone --nproc_per_node=8 train.py config/tost_owt.py

out_dir = "out-tost-owt"
wandb_run_name = "tost-base-owt"
eval_interval = 1000
log_interval = 10
compile = True
tssa_impl = "auto"  # the Triton kernels where they pass their first-call check (CUDA), else the reference
