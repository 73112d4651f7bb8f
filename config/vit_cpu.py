# A small ToST-ViT on the built-in "shapes" data (ten shapes drawn with torch: no download),
# sized for a CPU: a few minutes on one core, well above the 10% chance. Then look inside it:
#   python vit_train.py config/vit_cpu.py
#   python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt
# The softmax-attention baseline at the same size: add --attn=softmax --out_dir=out-vit-cpu-softmax
# (only what differs from vit_train.py's defaults is listed)

out_dir = "out-vit-cpu"
eval_interval = 250
log_interval = 50

patch_size = 8  # 4 x 4 = 16 tokens (patch_size=4: 64 tokens, finer Pi maps, ~4x the time)
n_layer = 4
n_embd = 96

batch_size = 64
max_iters = 2000
warmup_iters = 100

# a lighter built-in recipe than ImageNet's: the task is small and the run is short
crop_scale = (0.6, 1.0)
mixup = 0.0
cutmix = 0.0
eval_crop_pct = 1.0  # the images are already 32 x 32

# one thread: this model is too small to gain from more, and on a shared or small CPU extra
# threads mostly wait on each other
num_threads = 1
