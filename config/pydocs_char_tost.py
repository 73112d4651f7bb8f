# A small character-level ToST (0.59M parameters) on the embedded corpus (docstrings of Python's
# standard library): the README's first command. 1200 iterations of 16 x 128 characters on one
# CPU core, no download:
#   python prepare_char.py && python train.py config/pydocs_char_tost.py
#   python sample.py --out_dir=out-pydocs-char-tost
# The softmax baseline at the same parameter count is config/pydocs_char_softmax.py; the paper's
# layer alone is --short_conv=0. README.md (Language) has the table of every variant on this budget.

out_dir = "out-pydocs-char-tost"
dataset = "pydocs_char"
init_from = "auto"  # run the command again: it continues the run, or says it is done
eval_interval = 200
eval_iters = 10
log_interval = 25

# 6 ToST layers have the parameters of 5 softmax layers (TSSA has one C x C input map, not three)
n_layer = 6
n_head = 4
n_embd = 96
block_size = 128
# A causal convolution over the last 4 characters before each TSSA layer: TSSA's prefix statistics
# are order-free, so without it a character barely sees the one before it and the model writes
# bigram gibberish (MATH.md §4.6); 0 gives the paper's layer
short_conv = 4

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
