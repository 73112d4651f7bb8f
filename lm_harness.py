"""
lm-evaluation-harness's own command line (every option of `lm-eval run`) with a train.py
checkpoint as the model "nanotost" (nanotost/lm_eval_adapter.py registers it; an optional extra,
`pip install lm-eval==0.4.13`):

    python lm_harness.py --model nanotost --model_args out_dir=out-tost-owt --tasks lambada_openai --batch_size 8
    python lm_harness.py --model nanotost --model_args out_dir=out-pydocs-char-tost --tasks my_task.yaml --device cpu
    python lm_harness.py --model nanotost --model_args init_from=<you>/tost-owt --tasks lambada_openai

lm-eval hands the model its own --batch_size and --device (which defaults to cuda:0), so those
are not model_args: one given both ways is refused in one line. The model_args: out_dir (or
ckpt_path), or init_from (a folder export.py wrote, or its Hugging Face Hub id), dtype, stride,
tssa_impl.
The `lm_eval` command alone does not know "nanotost" (a program that imports lm_eval_adapter
first does). The shorter way in, which also appends the metrics to out_dir/eval.jsonl:

    python evaluate.py --out_dir=out-tost-owt --harness=lambada_openai,wikitext
"""

from nanotost import cli


def main():
    from nanotost import lm_eval_adapter  # noqa: F401  (registers "nanotost"; without lm-eval: one line that says how to install it)
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    cli.run_cli(main)
