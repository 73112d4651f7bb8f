# ONE configuration for every attention (the reviewers' request): listops_tiny_tost.py's data,
# model and schedule with nothing changed per model, not even the MLP (so the softmax and
# linear-attention Transformers have two C x C matrices per layer more than ToST: 77,002
# parameters each against 60,370). The model is chosen on the command line:
#   python lra/generate.py --task=listops --out_dir=data/listops_tiny --n_train=2000 \
#       --n_val=400 --n_test=400 --min_len=10 --max_len=60 --max_depth=3 --max_args=5
#   python lra/train.py lra/configs/listops_tiny_shared.py --attn=tssa --seed=1 --out_dir=out-lra/shared_tssa_1
#   (and --attn=softmax, --attn=linear; --seed=2, 3)
task = "listops"
data_dir = "data/listops_tiny"
cache_dir = ""
max_len = 64
pad_multiple = 8
n_layer = 2
n_embd = 64
n_head = 4
mlp_hidden = 128
dropout = 0.0
batch_size = 32
learning_rate = 4e-3
lr_schedule = "linear"
warmup_iters = 20
weight_decay = 1e-2
max_iters = 1000
eval_interval = 250
log_interval = 250
num_threads = 1
out_dir = "out-lra/listops_tiny_shared"
