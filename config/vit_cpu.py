# A small ToST-ViT on the built-in "shapes" data (ten shapes drawn with numpy: no download),
# sized for a CPU: a few minutes (measured: 4 min on one core of a busy 2-core machine, val top-1
# 68% against 10% chance). Then look inside it:
#   python vit_train.py config/vit_cpu.py
#   python vit_inspect.py --ckpt=out-vit-cpu/ckpt.pt
# The softmax-attention baseline at the same size: add --attn=softmax --out_dir=out-vit-cpu-softmax

out_dir = "out-vit-cpu"
dataset = "shapes"
shapes_train_size = 20000
shapes_val_size = 2000
img_size = 32
eval_interval = 250
log_interval = 50

patch_size = 8  # 4 x 4 = 16 tokens (patch_size=4: 64 tokens, finer Pi maps, ~4x the time)
n_layer = 4
n_head = 4
n_embd = 96
layer_scale_init = 1.0
attn = "tssa"

batch_size = 64
gradient_accumulation_steps = 1
max_iters = 2000
warmup_iters = 100
learning_rate = 1e-3
min_lr = 1e-5
weight_decay = 0.05

# a lighter recipe than ImageNet's: the task is small and the run is short
crop_scale = (0.6, 1.0)
hflip = True
randaug_n = 0
mixup = 0.0
cutmix = 0.0
label_smoothing = 0.1
eval_crop_pct = 1.0  # the images are already 32 x 32

dtype = "float32"
# one thread: this model is too small to gain from more, and on a shared or small CPU extra
# threads mostly wait on each other (measured here: 90 ms/step with 1 thread, 500+ with 2 on a busy box)
num_threads = 1
