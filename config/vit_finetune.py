# Fine-tuning a pre-trained ToST-ViT on a smaller dataset, as released: AdamW, learning rate
# 1e-4, weight decay 0.01, batch 256, plain cross-entropy (no label smoothing), no mixup or
# cutmix; a new head, the body from the checkpoint, images resized to the pre-training size.
#   python vit_train.py config/vit_finetune.py --finetune_from=out-vit-tost-s/ckpt.pt --dataset=cifar10
# (--dataset=cifar100, or --dataset=folder --data_dir=DIR; --out_dir to keep runs apart)

out_dir = "out-vit-finetune"
init_from = "finetune"
dataset = "cifar10"
img_size = 224
num_workers = 8
eval_interval = 1000
log_interval = 100

batch_size = 256
_iters_per_epoch = 50000 // 256  # CIFAR: 195 steps per epoch
max_iters = 100 * _iters_per_epoch  # ours (MATH.md §6.3): 100 epochs
warmup_iters = _iters_per_epoch  # our choice: one epoch
learning_rate = 1e-4
min_lr = 1e-6
weight_decay = 0.01
grad_clip = 0.0

crop_scale = (0.08, 1.0)  # built-in recipe: random resized crop and flip only
mixup = 0.0
cutmix = 0.0
label_smoothing = 0.0

dtype = "bfloat16"
