# ToST-T (5.8M parameters: 12 layers, 4 heads, width 192) on ImageNet-1k with the
# paper's recipe (MATH.md §5.3, §6.3) through timm (recipe="paper": pip install timm, see the README):
# AdamW, 400 epochs at batch 2048, weight decay 0.05, cosine decay, 5 warmup epochs,
# RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25, repeated augmentation x3, mixup 0.8,
# cutmix 1.0, label smoothing 0.1, bicubic; 224x224 images, 16x16 patches (196 tokens).
# Data: Hugging Face "ILSVRC/imagenet-1k" (gated: accept its terms, `hf auth login`),
# or an image tree: --dataset=folder --data_dir=/path/to/imagenet (train/ and val/ of class folders).
#   torchrun --standalone --nproc_per_node=8 vit_train.py config/vit_tost_t.py
# 2048 images per step = batch_size 256 x gradient_accumulation_steps 8 (1 per GPU on 8).

out_dir = "out-vit-tost-t"
dataset = "imagenet-1k"
recipe = "paper"
img_size = 224
num_workers = 8
eval_interval = 2500
log_interval = 100

patch_size = 16
n_layer = 12
n_head = 4
n_embd = 192
layer_scale_init = 1.0  # 12-layer models (MATH.md §5.3)
drop_path = 0.0  # the same rate in every block, as released

batch_size = 256
gradient_accumulation_steps = 8
_iters_per_epoch = 1281167 // 2048  # 625 steps per epoch
max_iters = 400 * _iters_per_epoch
warmup_iters = 5 * _iters_per_epoch
learning_rate = 2e-3  # ours, not the paper's (MATH.md §6.3): 5e-4 per 512 images (XCiT's rule) at 2048
grad_clip = 0.0  # no clipping (XCiT's default)

dtype = "bfloat16"
compile = True
