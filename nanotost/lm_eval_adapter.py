"""
nanoToST's model for EleutherAI's lm-evaluation-harness (lm-eval), the tool language models are
compared with (the paper's Table 4: LAMBADA, WikiText, PTB, ... zero-shot). An optional extra:
`pip install lm-eval==0.4.13`. A library: importing it registers the model under the name
"nanotost" with lm-eval's registry (without lm-eval the import is a one-line UserError). Two
commands use it:

    python evaluate.py --out_dir=out-tost-owt --harness=lambada_openai,wikitext   # run_tasks
    python lm_harness.py --model nanotost --model_args out_dir=out-tost-owt --tasks lambada_openai
    python lm_harness.py --model nanotost --model_args init_from=<you>/tost-owt --tasks lambada_openai

lm-eval's tasks fetch their data sets from the Hugging Face Hub once (then cached); a task YAML
file can point at local data instead (dataset_path: json, dataset_kwargs: data_files).

What the three kinds of request do (NanoToSTLM):
  loglikelihood          log P(continuation | context), and whether greedy decoding would write
                         the continuation (the argmax over the tokenizer's real vocabulary at
                         every continuation position); context + continuation keep their last
                         block_size + 1 tokens (a continuation longer than the block is scored
                         in windows, as below)
  loglikelihood_rolling  the log-probability of a whole text, cut into windows of block_size
                         (model_args stride=N: overlapping ones) with textdata.windows, the
                         windows evaluate.py scores a split with, so the two agree (softmax over
                         the whole vocab_size, as its loss); the first token is conditioned on
                         <|endoftext|> (GPT-2 BPE) or, at character level, on "\\n", the
                         separator prepare_char.py puts between documents (the lowest id if
                         the vocabulary has no "\\n")
  generate_until         greedy decoding (sampling if the task asks: do_sample, temperature,
                         top_k) from ToST's recurrent state (GPT.generate: constant work per
                         token; a fork whose decoding differs from its parallel form is told so
                         once, and decoded by the parallel form, forks.check_decoding), cut
                         at the first stop string, at most max_gen_toks tokens; the
                         context keeps its last block_size - max_gen_toks tokens (at least half
                         the block), so the text stays within the learned positions. The
                         settings follow sample.py's rules (loading.check_generation: top_k 0
                         is no limit, temperature >= 0, until is text): a task that breaks them
                         is one line naming it

Requests are batched (batch_size rows of up to block_size tokens per forward pass, rows of
similar length together); bfloat16 autocast on GPUs, float32 on the CPU (trainkit's chooser);
log-probabilities are computed in float32. One process.
"""

import os
import warnings
from types import SimpleNamespace

import torch
from tqdm import tqdm

import kernels
from nanotost import cli, devices, forks, loading
from nanotost import textdata as td

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:
    raise cli.UserError("lm-eval is not installed (an optional extra): pip install lm-eval==0.4.13") from None

GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k"}  # what generate_until follows
LM_EVAL_OWN = ("batch_size", "max_batch_size", "device")  # lm-eval passes these to the model itself
GEN_CHUNK = 32  # tokens generate_until decodes between two looks for its stop strings


def score_rows(stream, n_score, T, stride):
    """Rows (tokens, skip) of at most T + 1 tokens that score the last n_score predictions of
    `stream` (prediction i: token i + 1 from the tokens up to i) exactly once each: token j of a
    row predicts token j + 1, and its first `skip` predictions are context only. A short
    target is one row with the most context that fits; a longer one follows textdata.windows."""
    if n_score <= T:
        row = stream[-(T + 1):]
        return [(row, len(row) - 1 - n_score)]
    first = len(stream) - 1 - n_score  # predictions before this one are context
    rows = []
    for start, skip in td.windows(len(stream), T, stride):
        end = min(start + T, len(stream) - 1)  # this window predicts [start + skip, end)
        if end > first:
            rows.append((stream[start:end + 1], max(skip, first - start)))
    return rows


def as_int(name, value):
    """A number from lm-eval's model_args / batch_size (which may arrive as text)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise cli.UserError(f"{name} must be a whole number for the nanotost model, got {value!r}") from None


def register(cls):
    """Register cls with lm-eval as "nanotost" (kept as it is where an earlier import of this
    module already did: a test that imports it again)."""
    try:
        return register_model("nanotost")(cls)
    except ValueError:
        return cls


@register
class NanoToSTLM(LM):
    """A train.py checkpoint (ToST or the softmax baseline) as an lm-eval model. model_args
    (lm_harness.py --model_args): out_dir (or ckpt_path; default out), or init_from (a folder
    export.py wrote, or its Hub id), dtype, stride (of the rolling windows, as evaluate.py's; 0:
    block_size), tssa_impl. batch_size and device are lm-eval's own options (--batch_size,
    --device), which it hands to the model; evaluate.py passes them directly."""

    def __init__(self, out_dir=None, ckpt_path="", init_from="", device="auto", dtype="auto", batch_size=8, stride=0,
                 tssa_impl="torch", max_batch_size=None, **unknown):
        super().__init__()
        if unknown:
            raise cli.UserError(f"the nanotost model takes no {', '.join(sorted(unknown))}; its model_args: out_dir, "
                                "ckpt_path, init_from, dtype, stride, tssa_impl")
        cli.require(tssa_impl in kernels.IMPLS,
                    f"tssa_impl must be one of {', '.join(kernels.IMPLS)}, got {tssa_impl!r}")
        self._device, self.dtype = devices.choose_device_dtype(device or "auto", dtype or "auto")
        self.batch_size = as_int("batch_size", 8 if batch_size in (None, "auto") else batch_size)
        cli.require(self.batch_size >= 1, f"batch_size must be at least 1, got {self.batch_size}")
        where = SimpleNamespace(out_dir=out_dir or "out", ckpt_path=ckpt_path, init_from=init_from, tssa_impl=tssa_impl)
        self.model, ckpt, _ = loading.load_reader_model(where, self._device, given={"out_dir"} if out_dir else ())
        self.T = self.model.config.block_size
        self.stride = as_int("stride", stride) or self.T
        cli.require(0 < self.stride <= self.T, f"stride must be in 1..block_size ({self.T}), got {self.stride}")
        self.autocast = torch.autocast("cuda" if self._device.startswith("cuda") else "cpu",
                                       dtype=devices.DTYPES[self.dtype], enabled=self.dtype != "float32")
        self.info, self.iter_num = ckpt["tokenizer"], ckpt.get("iter_num")
        self.encode, self.decode = td.load_tokenizer(self.info)
        self.tokenizer_vocab_size = self.info["vocab_size"]  # the ids above only pad vocab_size: never drawn
        self.generate = None  # how generation runs (forks.generator: asked once, at the first request)
        if self.info["tokenizer"] == "char":
            chars = self.info["chars"]
            self.prefix_id, self.eot_text = (chars.index("\n") if "\n" in chars else 0), None
        else:
            self.eot_text = "<|endoftext|>"
            self.prefix_id = self.encode(self.eot_text)[0]

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        """lm-eval's way in (lm_harness.py): --model_args, plus lm-eval's own batch_size,
        max_batch_size and device; a setting given both ways is one line naming it."""
        own = {k: v for k, v in (additional_config or {}).items() if v is not None}
        both = sorted(set(arg_dict) & set(own))
        if both:
            raise cli.UserError(f"--model_args {', '.join(both)}: lm-eval hands the model its own "
                                f"{', '.join('--' + k for k in both)}; give {'them' if len(both) > 1 else 'it'} "
                                "that way, not in --model_args")
        return cls(**arg_dict, **own)

    def get_model_info(self):
        c = self.model.config
        return dict(nanotost_iter=self.iter_num, nanotost_attn=c.attn, nanotost_block_size=c.block_size,
                    nanotost_tokenizer=self.info["tokenizer"], nanotost_dtype=self.dtype)

    # -------------------------------------------------------------------------
    # scoring

    def _score(self, requests):
        """requests: (stream, n_score) pairs. Returns, for each, (sum of the log-probabilities of
        its last n_score tokens, whether every one of them is the greedy choice)."""
        rows = [(r, row, skip) for r, (stream, n) in enumerate(requests)
                for row, skip in score_rows(stream, n, self.T, self.stride)]  # (request, tokens, skip)
        rows.sort(key=lambda item: -len(item[1]))  # similar lengths share a batch: little padding
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        for i in tqdm(range(0, len(rows), self.batch_size), desc="nanotost scoring", disable=None):
            batch = rows[i:i + self.batch_size]
            L = len(batch[0][1]) - 1
            x = torch.zeros(len(batch), L, dtype=torch.long)  # (B, L), right-padded: causal, so padding is never seen
            y = torch.full((len(batch), L), -1, dtype=torch.long)  # (B, L), -1: not scored
            for b, (_, row, skip) in enumerate(batch):
                x[b, :len(row) - 1] = torch.tensor(row[:-1])
                y[b, skip:len(row) - 1] = torch.tensor(row[skip + 1:])
            x, y = x.to(self._device), y.to(self._device)
            with torch.no_grad(), self.autocast:
                logits, _ = self.model(x)  # (B, L, V)
            logits = logits.float()
            scored = y != -1
            target = y.clamp_min(0)[..., None]
            lp = (logits.gather(-1, target)[..., 0] - logits.logsumexp(-1)) * scored  # (B, L)
            hit = (logits[..., :self.tokenizer_vocab_size].argmax(-1) == y) | ~scored  # (B, L)
            for (r, _, _), row_lp, row_hit in zip(batch, lp.sum(1).tolist(), hit.all(1).tolist()):
                logprob[r] += row_lp
                greedy[r] = greedy[r] and row_hit
        return list(zip(logprob, greedy))

    def _encode_pair(self, context, continuation):
        """Token ids of (context, continuation); an empty context is the prefix token. With BPE
        the spaces that end the context go with the continuation (as lm-eval's own models do:
        BPE writes " word" as one token); characters need no such move."""
        spaces = len(context) - len(context.rstrip(" "))
        if spaces and self.info["tokenizer"] != "char":
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        return (self.encode(context) if context else [self.prefix_id]), self.encode(continuation)

    def loglikelihood(self, requests):
        pairs = [self._encode_pair(*req.args) for req in requests]
        results = self._score([(ctx + cont, len(cont)) for ctx, cont in pairs])
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests):
        texts = [req.args[0] for req in requests]
        streams = [[self.prefix_id] + self.encode(text) for text in texts]
        results = [logprob for logprob, _ in self._score([(s, len(s) - 1) for s in streams])]
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, result)
        return results

    # -------------------------------------------------------------------------
    # generation

    def _gen_settings(self, kwargs, task):
        """(stop strings, max_gen_toks, temperature, top_k or None) from a request's generation
        kwargs, by sample.py's rules (loading.check_generation); a wrong one is one line that
        names the task."""
        kwargs = dict(kwargs or {})
        unknown = sorted(set(kwargs) - GEN_KWARGS)
        if unknown:
            warnings.warn(f"nanotost ignores the generation settings {', '.join(unknown)} "
                          f"(it follows {', '.join(sorted(GEN_KWARGS))})")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else until
        try:
            cli.require(isinstance(until, (list, tuple)) and all(isinstance(s, str) for s in until),
                        f"until must be a string or a list of strings, got {until!r}")
            given = loading.check_generation(max_gen_toks=kwargs.get("max_gen_toks", 256), top_k=kwargs.get("top_k") or 0,
                                        temperature=kwargs.get("temperature") or 0.0)
        except cli.UserError as e:
            raise cli.UserError(f"lm-eval task {task!r}: generation_kwargs: {e} (nanotost follows sample.py: "
                                "temperature >= 0, 0 greedy; top_k >= 0, 0 no limit; until: strings)") from None
        until = [s for s in until if s]
        if self.eot_text and self.eot_text not in until:
            until.append(self.eot_text)
        temperature = given.temperature if kwargs.get("do_sample") else 0.0
        return tuple(until), given.max_gen_toks, temperature, given.top_k or None

    def _generate(self, prompts, until, max_gen_toks, temperature, top_k):
        """Continue prompts of one length (a list of id lists) together; each text is cut at its
        first stop string. model.generate runs GEN_CHUNK tokens at a time (the prompt and what is
        written so far encoded again in parallel), and decoding ends when every row has a stop
        string (or after max_gen_toks)."""
        if self.generate is None:  # a fork whose decoding differs from its parallel form: said once
            self.generate = forks.generator(self.model, "generating by the parallel form instead")
        idx = torch.tensor(prompts, dtype=torch.long, device=self._device)  # (B, T0)
        T0, texts = idx.shape[1], [""] * len(prompts)
        with torch.no_grad(), self.autocast:
            while idx.shape[1] - T0 < max_gen_toks:
                n = min(GEN_CHUNK, max_gen_toks - (idx.shape[1] - T0))
                idx = self.generate(idx, n, temperature=temperature, top_k=top_k,
                               tokenizer_vocab_size=self.tokenizer_vocab_size)
                texts = [self.decode(row[T0:]) for row in idx.tolist()]
                if all(any(s in text for s in until) for text in texts):
                    break
        cut = []
        for text in texts:
            ends = [text.index(s) for s in until if s in text]
            cut.append(text[:min(ends)] if ends else text)
        return cut

    def generate_until(self, requests):
        jobs = []  # (request index, prompt ids, settings)
        for r, req in enumerate(requests):
            context, kwargs = req.args
            settings = self._gen_settings(kwargs, req.task_name)
            keep = max(self.T - settings[1], self.T // 2, 1)
            jobs.append((r, ((self.encode(context) if context else []) or [self.prefix_id])[-keep:], settings))
        jobs.sort(key=lambda job: (-len(job[1]), repr(job[2])))  # one length and one setting per batch
        results = [None] * len(requests)
        i = 0
        with tqdm(total=len(jobs), desc="nanotost generating", disable=None) as bar:
            while i < len(jobs):
                j = i + 1  # jobs[i:j]: one batch, of one prompt length and one setting
                while j < len(jobs) and j - i < self.batch_size and \
                        (len(jobs[j][1]), jobs[j][2]) == (len(jobs[i][1]), jobs[i][2]):
                    j += 1
                texts = self._generate([job[1] for job in jobs[i:j]], *jobs[i][2])
                for (r, _, _), text in zip(jobs[i:j], texts):
                    results[r] = text
                    self.cache_hook.add_partial("generate_until", requests[r].args, text)
                bar.update(j - i)
                i = j
        return results


# -----------------------------------------------------------------------------
# running tasks (evaluate.py --harness=...)


def load_tasks(specs):
    """A TaskManager and the check that each task spec (a name of lm-eval, or a task YAML file)
    loads, with its data: an unknown name or data that cannot be fetched is one line."""
    import yaml
    from lm_eval.tasks import TaskManager

    for spec in specs:
        cli.require(not spec.endswith((".yaml", ".yml")) or os.path.isfile(spec), f"task file {spec!r} not found")
    local = all(os.path.isfile(spec) for spec in specs)  # YAML files only: no need to index lm-eval's tasks (~10 s)
    online = devices.hub_reachable()  # offline: the cache or nothing, at once (no ~25 s of retries)
    manager = TaskManager(include_defaults=not local)
    for spec in specs:
        try:
            manager.load([spec])
        except KeyError:
            raise cli.UserError(f"{spec!r} is neither a task of lm-eval nor a task YAML file (with a `task:` key): "
                                "`lm-eval ls tasks` lists the tasks") from None
        except yaml.YAMLError as e:  # a task YAML that does not parse
            mark = getattr(e, "problem_mark", None)
            where = f"{spec}:{mark.line + 1}" if mark is not None else spec
            raise cli.UserError(f"{where}: not YAML ({getattr(e, 'problem', None) or type(e).__name__}): correct the "
                                "task file (lm-eval's task YAML)") from None
        except ValueError as e:
            raise cli.UserError(f"{spec!r} is not a task lm-eval can load ({str(e).splitlines()[0][:160]})") from None
        except (ConnectionError, OSError) as e:
            if isinstance(e, OSError) and e.filename:  # the cache's folder cannot be written: run_cli names it
                raise
            offline = "" if online else "; offline: the Hub was not reached"
            raise cli.UserError(f"lm-eval task {spec!r} could not load its data ({str(e).splitlines()[0][:160]}"
                                f"{offline}): the harness's tasks fetch their data sets from the Hugging Face Hub, "
                                "so run this once online (they are cached under HF_HOME), or give a task YAML file "
                                "over local data") from None
    return manager


def run_tasks(lm, specs, limit=0, bootstrap_iters=100000):
    """lm-eval's simple_evaluate on the tasks `specs` (names or YAML files), zero-shot unless a
    task says otherwise; at most `limit` documents per task (0: all); standard errors from
    bootstrap_iters resamples (lm-eval's default; 0: none). Returns (results, table)."""
    from lm_eval import evaluator
    from lm_eval.utils import make_table

    manager = load_tasks(specs)
    results = evaluator.simple_evaluate(model=lm, tasks=list(specs), task_manager=manager, limit=limit or None,
                                        log_samples=False, bootstrap_iters=bootstrap_iters)
    return results, make_table(results)

