"""
results/benchkit/run_cached.py: run a script as `python SCRIPT ARGS...` runs it, then keep what its
torch.compile built (results/benchkit/compile_cache.py): the main job's train.py, so that the next GPU
window finds its compiles. Nothing else differs: the script runs as __main__, with its own
arguments, and ends as it ends.

    python -m results.benchkit.run_cached <artifacts file> train.py config/tost_owt.py --max_iters=60 ...
"""

import runpy
import sys

from results.benchkit.compile_cache import save_here


def main(save_to, script, *args):
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        try:
            save_here(save_to)
        except Exception as e:  # noqa: BLE001 (the cache is a saving of time, never the script's failure)
            print(f"results/benchkit/run_cached.py: the compile cache was not kept ({type(e).__name__}: {e})", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
