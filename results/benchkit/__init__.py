"""
benchkit: the code of bench.py (which holds the settings and picks the mode), one module per
part, so that each is found and changed alone:

    settings.py      the settings checked before any work; the shapes every mode shares
    timing.py        how a call is timed (wall, CUDA events, torch.profiler), peak memory, SDPA backends
    suites.py        the suites (bench.py without --report or --headline): tables for any device
    report.py        --report: its sections, and the runner it shares with --headline (each section
                     in its own time-limited process, every row into the JSON as it is measured)
    headline.py      --headline: the figures that matter most, by value, under one deadline
    order.py         the headline's order of value: the target rows, then the rest, in stages
    plan.py          the headline's plan: every row in order with its estimate (--plan_from prints it)
    costs.py         what a row costs, from the rows a device measured before (or the nearest one)
    reportfile.py    the one reading of a report's JSON (the runner's, the plan's, the renderer's)
    compile_cache.py torch.compile's artifacts kept from one GPU window to the next (run_cached.py:
                     a script run so, the main job's train.py)
    part.py          one section as its process measures it (Part), why a row cannot run here
    keeper.py        the process that ends a section's group once the command or the section is gone
    meta.py          the device, versions, the code's digest (source_digest) and commit
    gpu_check.py     the sections gpu_check_accuracy / _determinism (kernels/gpu_check.py)
    op.py            the section op: the operator fwd+bwd against SDPA
    kernel_times.py  the section kernel_times: each Triton launch against launch_plan()
    train_step.py    the training sections: ToST-Base against GPT-2 Base, one step
    decode.py        the section decode: a token at a time, eager, CUDA graph, compiled
    main_job.py      the section main_job: train.py on the main configs, tokens/s and MFU

    python bench.py --help
"""
