# The softmax-attention (GPT-2 style) baseline of config/pydocs_char_tost.py: same data,
# schedule and parameter budget (5 softmax layers = 6 ToST layers: 578,592 vs 585,336
# parameters, 583,032 without the short convolution).
#   python prepare_char.py && python train.py config/pydocs_char_softmax.py
#   python sample.py --out_dir=out-pydocs-char-softmax

out_dir = "out-pydocs-char-softmax"
dataset = "pydocs_char"
init_from = "auto"  # run the command again: it continues the run, or says it is done
eval_interval = 200
eval_iters = 10
log_interval = 25

n_layer = 5
n_head = 4
n_embd = 96
block_size = 128
attn = "softmax"
layer_scale_init = 0.0  # GPT-2 has no layer scale

batch_size = 16
gradient_accumulation_steps = 1
learning_rate = 2e-3
max_iters = 1200
lr_decay_iters = 1200
min_lr = 2e-4
warmup_iters = 100
beta2 = 0.99  # few tokens per step: a longer second-moment average steadies Adam
weight_decay = 0.1

device = "cpu"
num_threads = 1  # tiny matrices: one thread is almost as fast, and far faster on a busy machine
