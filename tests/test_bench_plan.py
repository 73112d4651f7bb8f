"""
The headline's plan, row by row (issue 44, item 2), in this process, with no GPU:

  1. a row starts when its own estimated cost fits in what is left of its section's time, and
     records what it cost (row_s); a row of another stage of the headline is left for it
  2. a row's cost comes from the rows a device measured before (results/benchkit/costs.py): its own,
     recorded whole or in parts; one never measured from the nearest row that was, each way
     of carrying a cost over a member of a parametrised test
  3. torch.compile's artifacts, kept from one window to the next (results/benchkit/compile_cache.py):
     which file is loaded and written, every member loaded, what a run saved gathered with
     what it loaded and did not write again; a script run through results/benchkit/run_cached.py runs
     as itself; the run's record of its compiles beside the same rows of the earlier report

    python -m pytest -q tests/test_bench_plan.py          # seconds
"""

import json
import os
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from results.benchkit import compile_cache, costs, order, plan  # noqa: E402
from results.benchkit.part import Part, row_key  # noqa: E402

SETTINGS = dict(warmup=1, repeats=5, decode_steps=50, main_iters=60)

# -----------------------------------------------------------------------------
# 1. each row by its own cost


def test_a_row_starts_when_its_own_estimate_fits_and_records_what_it_cost(tmp_path):
    big, small, unknown = dict(impl="cpu", B=1, T=8), dict(impl="sdpa", B=1, T=8), dict(impl="cpu", B=4, T=8)
    cfg = SimpleNamespace(device="cpu", quick=False, headline=True, estimates={row_key(big): 100.0,
                                                                             row_key(small): 0.5})
    S = Part("op", str(tmp_path / "part.json"), cfg, 10)
    passed = S.attempt(big, lambda: pytest.fail("started a row that cannot fit"))
    assert passed["status"] == "not_run" and "its estimated 100 s did not fit" in passed["reason"]
    ran = S.attempt(small, lambda: dict(ms=1.0))  # after a row passed over, a cheaper one still runs
    assert ran["status"] == "ok" and ran["row_s"] >= 0
    assert S.attempt(unknown, lambda: dict(ms=2.0))["status"] == "ok"  # nothing known of it: it starts
    assert S.spare_s() == pytest.approx(S.time_left() - S.reserve_s, abs=0.5)  # (every row recorded: all spare)
    fresh = Part("op", str(tmp_path / "fresh.json"), cfg, 10)  # what an optional measurement may take: the rest
    assert fresh.spare_s() == pytest.approx(fresh.time_left() - fresh.reserve_s - 100.5, abs=0.5)


@pytest.mark.parametrize("stage", [order.TARGET, order.EXTRA, None])
def test_a_row_of_another_stage_is_left_for_it(stage, tmp_path):
    cfg = SimpleNamespace(device="cpu", quick=True, headline=True, stage=stage)
    S = Part("op", str(tmp_path / "part.json"), cfg, 60)
    for impl in ("triton", "sdpa_cudnn", "compiled", "torch"):
        row = S.attempt(dict(impl=impl, B=1, T=8), lambda: dict(ms=1.0))
        mine = stage is None or order.tier("op", row) == stage
        assert (row["status"], row.get("reason")) == (("ok", None) if mine else ("not_run", order.LATER)), row


def test_the_order_of_value_puts_every_target_row_before_the_rest():
    assert [s for s, stage in order.STAGES if stage == order.EXTRA] == ["train", "main_job", "op", "decode"]
    last_target = max(i for i, (_, stage) in enumerate(order.STAGES) if stage == order.TARGET)
    assert all(stage == order.EXTRA for _, stage in order.STAGES[last_target + 1:])
    assert order.tier("train", dict(arch="tost", impl="triton")) == order.TARGET
    assert order.tier("train", dict(arch="tost", impl="auto")) == order.EXTRA
    assert order.tier("main_job", dict(arch="tost", impl="auto")) == order.EXTRA
    assert order.tier("decode", dict(arch="tost", impl="torch", mode="compiled")) == order.EXTRA
    assert order.tier("op", dict(impl="sdpa_flash")) == order.TARGET


# -----------------------------------------------------------------------------
# 2. what a row costs


def report(**sections):
    return dict(sections={name: dict(section=name, status="ok", rows=rows) for name, rows in sections.items()})


OP = dict(impl="triton", B=1, T=16384, status="ok", ms=1.0, first_call_s=0.5)
SDPA = dict(impl="sdpa_cudnn", B=1, T=16384, status="ok", ms=4.0, first_call_s=2.0)
TOST = dict(arch="tost", impl="triton", T=4096, B=16, status="ok", ms=130.0, first_call_s=0.1, compile_s=35.0)
AUTO = dict(arch="tost", impl="auto", T=16384, B=4, status="ok", ms=120.0, first_call_s=0.1, compile_s=124.0)
GPT2 = dict(arch="gpt2", backend="cudnn", T=16384, B=4, status="ok", ms=280.0, first_call_s=0.3, compile_s=27.0)
JOB = dict(arch="tost", impl="auto", iters=60, wall_s=132.0, tokens_per_s=480000, tokens_per_iter=61440, status="ok")
OLD_JOB = dict(iters=200, wall_s=87.0, tokens_per_s=480000, tokens_per_iter=61440, status="ok")  # (no arch: ToST)
SOURCE = report(op=[OP, SDPA, dict(OP, B=16, T=1024, row_s=7.5)], train=[TOST, AUTO, GPT2], main_job=[JOB, OLD_JOB])

# member: (section, the planned row, the words of how, the seconds or a check of them)
ESTIMATES = {
    "its own row, recorded whole": ("op", dict(impl="triton", B=16, T=1024), "measured: 7.5 s", 7.5),
    "its own row, in parts": ("op", dict(impl="triton", B=1, T=16384), "measured", lambda s: 0.5 < s < 3),
    "TSSA at 4x the tokens": ("op", dict(impl="triton", B=1, T=65536), "calls x4 (tokens (TSSA))", None),
    "SDPA at 4x the length": ("op", dict(impl="sdpa_cudnn", B=1, T=65536), "calls x16 (tokens x T (SDPA))", None),
    "ToST at another length": ("train", dict(arch="tost", impl="triton", T=65536, B=1), "from T=4096's row (ToST",
                               lambda s: 35 < s < 40),
    "GPT-2 at another length": ("train", dict(arch="gpt2", backend="cudnn", T=65536, B=1), "x4", lambda s: s > 27 + 9),
    "ToST with another impl at the same length": ("train", dict(arch="tost", impl="torch", T=4096, B=16),
                                                  "from triton's row at the same T", lambda s: 35 < s < 40),
    "a main job of another impl (auto's last)": ("main_job", dict(arch="tost", impl="triton"), "from the main job tost",
                                                 lambda s: s == pytest.approx(87 - 140 * 61440 / 480000)),
    "its own main job": ("main_job", dict(arch="tost", impl="auto"), "measured: train.py 132 s", 132.0),
    "GPT-2's main job from ToST's": ("main_job", dict(arch="gpt2"), "from the main job", lambda s: s > 0),
    "nothing like it": ("decode", dict(arch="tost", impl="triton", mode="captured", T=1024), None, None),
}


@pytest.mark.parametrize("member", sorted(ESTIMATES))
def test_a_rows_cost_comes_from_its_own_row_or_the_nearest_one_said_how(member):
    section, key, words, check = ESTIMATES[member]
    seconds, how = costs.Costs(SimpleNamespace(**SETTINGS), [("earlier.json", SOURCE)]).estimate(section, key)
    if words is None:
        assert seconds is None, how
        return
    assert words in how and seconds is not None and seconds > 0, (seconds, how)
    if callable(check):
        assert check(seconds), (seconds, how)
    elif check is not None:
        assert seconds == pytest.approx(check)


def test_a_scaled_row_costs_its_first_call_and_its_longer_calls():
    cfg = SimpleNamespace(**SETTINGS)
    est = costs.Costs(cfg, [("x", SOURCE)])
    one, _ = est.estimate("op", dict(impl="sdpa_cudnn", B=1, T=16384))
    four, _ = est.estimate("op", dict(impl="sdpa_cudnn", B=1, T=65536))  # calls 16x as long: fewer per repeat
    calls = cfg.warmup + 1 + cfg.repeats * costs.calls_per_repeat(64.0) + 3 + 1
    assert four - one == pytest.approx(64e-3 * calls - 4e-3 * (cfg.warmup + 1 + cfg.repeats * 5 + 3 + 1))


# -----------------------------------------------------------------------------
# 3. compiles kept from one window to the next


def test_the_compile_cache_is_found_beside_the_report_then_in_results(tmp_path, monkeypatch):
    out = tmp_path / "out" / "nvidia-h100.json"
    out.parent.mkdir()
    cfg = SimpleNamespace(compile_cache="auto")
    monkeypatch.setattr(compile_cache, "REPO", str(tmp_path))
    (tmp_path / "results").mkdir()
    beside = str(out.parent / "nvidia-h100.compile-cache.zip")
    assert compile_cache.files(cfg, str(out), "nvidia-h100", cuda=True) == (None, beside)  # none yet: written beside
    (tmp_path / "results" / "nvidia-h100.compile-cache.zip").write_bytes(b"z")
    assert compile_cache.files(cfg, str(out), "nvidia-h100", True)[0] == str(tmp_path / "results" /
                                                                          "nvidia-h100.compile-cache.zip")
    (out.parent / "nvidia-h100.compile-cache.zip").write_bytes(b"z")
    assert compile_cache.files(cfg, str(out), "nvidia-h100", True)[0] == beside  # this window's own first
    assert compile_cache.files(cfg, str(out), "nvidia-h100", cuda=False) == (None, None)  # the CPU compiles nothing
    assert compile_cache.files(SimpleNamespace(compile_cache="off"), str(out), "nvidia-h100", True) == (None, None)
    named = str(tmp_path / "mine.zip")
    assert compile_cache.files(SimpleNamespace(compile_cache=named), str(out), "x", True) == (None, named)


def test_what_a_run_saved_is_gathered_with_what_it_loaded_and_every_member_is_loaded(tmp_path, monkeypatch):
    loaded = tmp_path / "old.zip"
    with zipfile.ZipFile(loaded, "w") as z:
        z.writestr("op.json.target", b"old op")
        z.writestr("decode.json.target", b"old decode")
    tmp = tmp_path / "run"
    tmp.mkdir()
    (tmp / ("op.json.target" + compile_cache.PART)).write_bytes(b"new op")
    (tmp / ("main_job.json.tost-triton" + compile_cache.PART)).write_bytes(b"train.py's")
    written = tmp_path / "out" / "gpu.compile-cache.zip"
    assert compile_cache.gather(str(tmp), str(loaded), str(written)) == 3
    with zipfile.ZipFile(written) as z:
        got = {n: z.read(n) for n in z.namelist()}
    assert got == {"op.json.target": b"new op", "decode.json.target": b"old decode",
                   "main_job.json.tost-triton": b"train.py's"}
    assert compile_cache.gather(str(tmp_path / "nothing"), None, str(tmp_path / "none.zip")) == 0
    assert not (tmp_path / "none.zip").exists()  # nothing saved: nothing written
    import torch
    seen = []

    def load(blob):
        seen.append(blob)
        return SimpleNamespace(artifacts={"inductor": ["a", "b"], "aot_autograd": ["c"]})
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", load)
    got = compile_cache.load(str(written))
    assert sorted(seen) == [b"new op", b"old decode", b"train.py's"]
    assert (got["loaded"], got["members"], got["artifacts"]) == (True, 3, {"inductor": 6, "aot_autograd": 3})
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    assert compile_cache.load(str(tmp_path / "bad.zip"))["loaded"] is False  # the compiles cost again, no more
    assert compile_cache.load(None)["loaded"] is False


def test_a_script_run_to_keep_its_compiles_runs_as_itself(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(3)\n")
    done = subprocess.run([sys.executable, *compile_cache.keeping(SimpleNamespace(keep_compiles=True),
                                                                  str(tmp_path / "k")), str(script), "a", "--b=1"],
                          cwd=REPO, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "__main__ ['a', '--b=1']\n"), done.stderr
    assert not (tmp_path / ("k" + compile_cache.PART)).exists()  # it compiled nothing: nothing kept
    assert compile_cache.keeping(SimpleNamespace(keep_compiles=False), "k") == []


def test_a_run_records_its_compiles_beside_the_same_rows_of_the_earlier_report():
    merged = report(train=[dict(TOST, compile_s=5.0), dict(AUTO, kept_from="earlier")], op=[dict(OP, first_call_s=0.2)],
                    main_job=[dict(JOB, first_iter_s=9.0)], decode=[])
    got = plan.compile_record(merged, ["train", "op", "main_job"], [("results/gpu.json", SOURCE)])
    assert (got["seconds"], got["rows"]) == (14.2, 3)  # (a kept row was not compiled by this run)
    # (the earlier main job recorded no first iteration)
    assert got["before"] == dict(seconds=35.5, rows=2, source="results/gpu.json")
    assert json.loads(json.dumps(got)) == got
