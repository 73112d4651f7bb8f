# Retrieval (AAN pairs, bytes, 4000 per document, two towers), ToST: the paper's setting
# (MATH.md §6.4): 6 layers, width 128, 4 heads, MLP 512, batch 64, lr 1e-4, 10k warmup then
# linear decay, dropout 0.1, wd 4e-2, 92k steps.
task = "retrieval"
attn = "tssa"
n_layer = 6
n_embd = 128
n_head = 4
mlp_hidden = 512
dropout = 0.1
batch_size = 64
learning_rate = 1e-4
lr_schedule = "linear"
warmup_iters = 10000
weight_decay = 4e-2
max_iters = 92000
eval_interval = 2000
out_dir = "out-lra/retrieval_tost"
