"""
The launch model of the Triton TSSA kernels (kernels/triton_tssa.py): what each launch of one
forward and backward reads and writes, how many programs it runs and what each program does,
and the GPU time that gives. Modelled, not measured: plain arithmetic, no Triton, no GPU.

    from kernels.triton_tssa import launch_plan, modelled_time_s   # the kernels as they are
    plan = launch_plan(1, 12, 16384, 64)                             # B, H, T, p (bf16, causal)
    modelled_time_s(plan, "h100")                                    # seconds, all launches
    plan_for(AT_35FFD52, 1, 12, 16384, 64)                           # the kernels as measured

A description of the kernels (`kernels` below) is a dict: the knobs that cut a row into
chunks and blocks (triton_tssa.py's BLOCK_T, TILE_VALUES, FEATURE_BLOCK, SCAN_CHUNKS,
SCAN_COLUMNS, BATCH_BLOCK), how the scans are sized, and WORK: each chunk kernel's warps and
what one of its programs does. triton_tssa.described() gives the kernels as they are (its
knobs read at call time); AT_35FFD52 and AT_88ECCCE the kernels results/nvidia-h200.json
measured (commits 35ffd52 and 88ecccebc71c), priced by the same model:
tests/test_triton_design.py holds the model to every launch time recorded there.

The model of one launch (the constants below, fitted to those 36 launch times on the H200,
Triton 3.6; the copy rates measured):
  LAUNCH_S
  + the HBM bytes it reads and writes (each tensor once), and those it reads a second time in
    a row where it says so ("reread": the re-tiled B1), / the device's copy rate
  + the bytes its programs read again from L2 (other heads' per-token scalars, other batch
    rows' R) / L2_RATE
  + per program, x warps / 4 (a reduction's shuffles and barriers grow with the warps that
    take part: 8-warp programs measured about twice the 4-warp cost): its token-axis scans
    of a tile (tl.cumsum along tokens, the chunk's totals being a scan's last row) x SCAN_S,
    and its other reductions (a per-token vector scanned or summed along tokens, a tile
    summed along the features, a (tokens, heads) tile reduced across heads, a tile of R
    summed over batch rows) x SUM_S
  + per program, its tile's values x divisions a value (an IEEE fp32 division by a tile,
    the MUFU.RCP and its Newton steps) x DIV_S
  + a scan launch (_k_scan): its dependent steps x STEP_S (one load, scan and store of CB
    chunk totals after another), and programs x steps x warps x WARP_STEP_S.
What it does not see: occupancy and registers (tests/test_triton_builds.py bounds those),
overlap of one program's arithmetic with another's loads beyond what the fit absorbed, L2
hits on w re-read by the next launch. The fit leaves every recorded launch within 14%.

The re-tiled causal kernels (kernels/triton_retiled.py: a program per batch row and chunk over
every head, its rows walked in order) are priced by the same terms: retiled_plan() states their 10
launches, RETILED_TRAFFIC and RETILED_WORK what each moves and does. MODELLED, NOT MEASURED: no
GPU has run them, and the model's constants were fitted to the kernels above (see RETILED_WORK
for how a row's reductions are counted against them).
"""

import torch

# The copy rate: a device-to-device copy's bytes read + written per second (H200:
# results/nvidia-h200-probe.json; H100: the device machines' notes, about 3.0 TB/s)
COPY_RATE = {"h200": 4.13e12, "h100": 3.0e12}
LAUNCH_S = 1.0e-6  # a launch's start and tail
L2_RATE = 2.0e12  # bytes read again from L2 (strided per-token scalars) a second
SCAN_S = 0.92e-9  # a token-axis scan of a tile, a program of 4 warps
SUM_S = 0.43e-9  # any other reduction, a program of 4 warps
DIV_S = 0.21e-12  # a division, a value (0.43 ns a 2048-value tile)
STEP_S = 0.70e-6  # a scan launch's dependent step
WARP_STEP_S = 0.57e-9  # a scan program's step, a warp (256 chunk totals of 8 values a thread)
REFERENCE_WARPS = 4  # the warps SCAN_S and SUM_S are for
SCAN_VALUES_PER_WARP = 256  # chunk totals a warp of a scan program holds a step (8 a thread: as measured)

FORWARD = ("_k_sq_totals", "_k_scan", "_k_u", "_k_pi_totals", "_k_scan", "_k_out")
BACKWARD = ("_k_grad_totals", "_k_scan", "_k_pi_grad", "_k_logit_grad", "_k_scan", "_k_grad_w")
# The scans of one call, in launch order: (the totals scanned, their columns past p, mode)
SCANS = {"forward": (("tS", 0, "prefix"), ("tMN", 1, "prefix")),
         "backward": (("tG", 1, "suffix"), ("tGS", 0, "suffix"))}

# What each chunk launch moves in HBM (the tensors it reads and writes, each once: their sizes
# in _sizes) and what its programs read again from L2 (the other heads' columns of a (BT, H)
# tile of per-token scalars, other batch rows' R). The same for the kernels now and at 35ffd52.
TRAFFIC = {
    "_k_sq_totals": dict(read=("w", "mask"), write=("tS",), again=("mask_heads",)),
    "_k_u": dict(read=("w", "mask", "bias", "cS"), write=("u",), again=("mask_heads", "bias_rows")),
    "_k_pi_totals": dict(read=("w", "mask", "u"), write=("pi", "tMN"), again=("mask_heads", "u_heads")),
    "_k_out": dict(read=("w", "mask", "pi", "cMN"), write=("out",), again=("mask_heads",)),
    "_k_grad_totals": dict(read=("w", "g", "mask", "pi", "cMN"), write=("y", "tG"), again=("mask_heads",)),
    "_k_pi_grad": dict(read=("w", "mask", "pi", "cG", "y"), write=("y",), again=("mask_heads",)),
    "_k_logit_grad": dict(read=("w", "mask", "y", "pi", "u", "cS"), write=("R", "gtemp", "tGS"),
                          again=("mask_heads", "y_heads")),
    "_k_grad_w": dict(read=("w", "g", "mask", "pi", "R", "cS", "cMN", "cG", "cGS", "gtemp"),
                      write=("dw", "dtemp", "dbias"), again=("mask_heads", "R_batch")),
}


def work(warps, scans, sums, divs):
    """What one program of a chunk kernel does: its warps; its token-axis scans of a tile and
    its other reductions, each as (causal, non-causal); its divisions a value of its tile."""
    return dict(warps=warps, scans=scans, sums=sums, divs=divs)


# The kernels as results/nvidia-h200.json measured them (commit 35ffd52), read from its code
# (each count checked against the MUFU.RCP and scan/reduce ops of its sm_90 build).
AT_35FFD52 = dict(
    name="35ffd52", BLOCK_T=64, TILE_VALUES=2048, FEATURE_BLOCK=16, SCAN_CHUNKS=256, SCAN_COLUMNS=8,
    BATCH_BLOCK=16, DW_VALUES=None, scans_sized=False, scan_warps=8, dbias_b1_direct=False,
    WORK={
        "_k_sq_totals": work(4, (1, 1), (0, 0), 0),  # the chunk's totals of w^2: a scan's last row
        "_k_u": work(4, (1, 0), (1, 1), 1),  # S = carry + scan; u = sum over features of w^2 / S
        "_k_pi_totals": work(4, (1, 1), (4, 4), 0),  # softmax across heads (max, sum, this head's column);
        # totals of Pi w^2 (a scan's last row) and of Pi (a sum along tokens)
        "_k_out": work(4, (1, 0), (1, 0), 1),  # M = carry + scan, n = carry + a scan of Pi; n / (n + M)
        "_k_grad_totals": work(8, (2, 1), (6, 3), 1),  # M and the suffix of dL/dM; scans of Pi and dL/dN,
        # three sums over features, dL/dN's total (non-causal: two sums over features and the total)
        "_k_pi_grad": work(4, (0, 0), (1, 1), 0),  # sum over features of the carries' part
        "_k_logit_grad": work(4, (2, 1), (3, 3), 1),  # S, the totals of dL/dS; the softmax backward across
        # heads (a sum, this head's column), dtemp's partial
        "_k_grad_w": work(4, (4, 0), (1, 0), 3),  # M, S, their suffix sums G_M, G_S; n; D, A and 1/n
    })


# The kernels of commit 88ecccebc71c, as results/nvidia-h200.json measured them: B1 at 4 warps
# with two sums over features, the scans sized to the row, and dL/dw one program a chunk and head
# (64 columns, 8 values of its tile a thread: 8 warps). Measured, B1 and dL/dw took 1.4x and 2x
# what this model gives them (tests/test_triton_design.py); the chunk kernels of now are these
# with dL/dw back at 16 columns and 4 warps (triton_tssa.py).
AT_88ECCCE = dict(
    AT_35FFD52, name="88ecccebc71c", FEATURE_BLOCK=64, DW_VALUES=8, scans_sized=True, scan_warps=None,
    dbias_b1_direct=True,
    WORK=dict(
        AT_35FFD52["WORK"],  # F1-F4, B2, B3: as they were
        _k_grad_totals=work(4, (2, 1), (4, 3), 1),  # M, the suffix of dL/dM; scans of Pi and dL/dN (its total
        # the suffix's first value), two sums over features (non-causal: two, and dL/dN's total); D; 1/n a token
        _k_grad_w=work(None, (4, 0), (1, 0), 2)))  # warps: DW_VALUES a thread; M, S, G_M, G_S; n; D and A (1/n a token)


def cdiv(a, b):
    return -(-a // b)


def next_power_of_2(n):
    return 1 << max(0, n - 1).bit_length()


def geometry(T, p, kernels):
    """How the kernels cut a row of T tokens of head width p: nC chunks of BT tokens, tiles
    (BT, P) of at most TILE_VALUES values (P: p padded to a power of two; shorter chunks when
    p is large); dL/dw's columns in nK blocks of BK; the scans' CB chunk totals a step (as
    many as the row has, up to SCAN_CHUNKS, where the scans are sized), SB columns a
    program, their warps and steps."""
    P = next_power_of_2(p)
    BT = max(16, min(kernels["BLOCK_T"], kernels["TILE_VALUES"] // P))
    nC = cdiv(max(T, 1), BT)
    BK = min(P, kernels["FEATURE_BLOCK"])
    CB = min(kernels["SCAN_CHUNKS"], next_power_of_2(nC)) if kernels["scans_sized"] else kernels["SCAN_CHUNKS"]
    SB = kernels["SCAN_COLUMNS"]
    warps = kernels["scan_warps"] or min(8, max(1, CB * SB // SCAN_VALUES_PER_WARP))
    dw_warps = kernels["WORK"]["_k_grad_w"]["warps"] or min(8, max(1, BT * BK // (32 * kernels["DW_VALUES"])))
    return dict(BT=BT, P=P, EVEN_P=P == p, nC=nC, BK=BK, nK=cdiv(p, BK), EVEN_K=p % BK == 0, dw_warps=dw_warps, CB=CB,
                SB=SB, scan_warps=warps, scan_steps=cdiv(nC, CB))


def _sizes(B, H, T, p, dtype, causal, has_mask, bias_width, nC):
    """Bytes of every tensor a launch moves (TRAFFIC's names)."""
    rows, f32 = B * H, 4
    scalar = rows * T * f32  # u, Pi, y, R: one fp32 a token and head
    chunk = rows * nC * p * f32  # a (B*H, nC, p) fp32 tensor of chunk totals or carries
    pair = rows * nC * (p + 1) * f32
    w = rows * T * p * torch.empty((), dtype=dtype).element_size()  # w, g, out, dw
    return dict(w=w, g=w, out=w, dw=w, mask=B * T if has_mask else 0, bias=H * T * f32 if causal else 0,
                u=scalar, pi=scalar, y=scalar, R=scalar, tS=chunk, cS=chunk, tGS=chunk, cGS=chunk,
                tMN=pair, cMN=pair, tG=pair, cG=pair, gtemp=rows * nC * f32, dtemp=H * f32,
                dbias=H * (bias_width or T) * f32 if causal else 0, mask_heads=(H - 1) * B * T if has_mask else 0,
                bias_rows=(B - 1) * H * T * f32 if causal else 0, u_heads=(H - 1) * scalar, y_heads=(H - 1) * scalar,
                R_batch=(B - 1) * H * T * f32 if causal else 0)


def _batch_sums(kernels, B, nK, causal):
    """dL/dw's sums over the batch for dpos_bias, averaged over its programs: the programs of
    batch row 0 (and column block 0) add ceil(B / BATCH_BLOCK) tiles of R each (none at B = 1
    where the kernels store R itself)."""
    if not causal or (B == 1 and kernels["dbias_b1_direct"]):
        return 0.0
    return cdiv(B, kernels["BATCH_BLOCK"]) / (B * nK)


def plan_for(kernels, B, H, T, p, dtype=torch.bfloat16, causal=True, has_mask=False, bias_width=None):
    """The launches of one forward and backward of `kernels`, in order: for each, its kernel
    (a scan's mode and carries too), grid (programs) and warps, the bytes it reads and writes
    in HBM (each tensor once) and reads again from L2, "tiles" (the (BT, P) tiles of w it
    loads), and what a program does: "scans" (token-axis scans of a tile), "sums" (its other
    reductions), "divs" (divisions a value) of its "values" (its tile's values); a scan's
    "steps" (dependent). bias_width: the position bias's columns (T)."""
    geo = geometry(T, p, kernels)
    sizes = _sizes(B, H, T, p, dtype, causal, has_mask, bias_width, geo["nC"])
    rows, nC, form = B * H, geo["nC"], 0 if causal else 1
    plan, scans = [], {"forward": iter(SCANS["forward"]), "backward": iter(SCANS["backward"])}
    for direction, names in (("forward", FORWARD), ("backward", BACKWARD)):
        for name in names:
            if name == "_k_scan":
                tot, extra, mode = next(scans[direction])
                carry = "c" + tot[1:]
                steps = geo["scan_steps"] * (1 if causal else 2)  # TOTAL: sum every step, then store every step
                plan.append(dict(kernel=name, direction=direction, mode=mode if causal else "total", carries=carry,
                                 grid=rows * cdiv(p + extra, geo["SB"]), warps=geo["scan_warps"], read=sizes[tot],
                                 write=sizes[carry], l2_read=0, tiles=0, scans=0, sums=0, divs=0, values=0,
                                 steps=steps))
                continue
            t, w = TRAFFIC[name], kernels["WORK"][name]
            blocks = geo["nK"] if name == "_k_grad_w" else 1
            width = geo["BK"] if name == "_k_grad_w" else geo["P"]
            sums = w["sums"][form] + (_batch_sums(kernels, B, blocks, causal) if name == "_k_grad_w" else 0)
            warps = geo["dw_warps"] if name == "_k_grad_w" else w["warps"]
            plan.append(dict(kernel=name, direction=direction, grid=rows * nC * blocks, warps=warps,
                             read=sum(sizes[k] for k in t["read"]), write=sum(sizes[k] for k in t["write"]),
                             l2_read=sum(sizes[k] for k in t["again"]), tiles=rows * nC, scans=w["scans"][form],
                             sums=sums, divs=w["divs"], values=geo["BT"] * width, steps=0))
    return plan


def modelled_time_s(plan, gpu="h100", copy_rate=None):
    """The GPU time of a plan's launches (or of one launch) on the model above. gpu: "h100" or
    "h200" (their measured copy rates), or copy_rate in bytes a second."""
    rate = copy_rate or COPY_RATE[gpu]
    plan = [plan] if isinstance(plan, dict) else plan
    total = 0.0
    for launch in plan:
        programs, warps = launch["grid"], launch.get("warps", REFERENCE_WARPS)
        total += (LAUNCH_S + (launch["read"] + launch["write"] + launch.get("reread", 0)) / rate
                  + launch.get("l2_read", 0) / L2_RATE
                  + programs * warps / REFERENCE_WARPS * (launch["scans"] * SCAN_S + launch["sums"] * SUM_S)
                  + programs * launch.get("values", 0) * launch.get("divs", 0) * DIV_S
                  + launch["steps"] * (STEP_S + programs * warps * WARP_STEP_S))
    return total


# -----------------------------------------------------------------------------
# The re-tiled causal kernels (kernels/triton_retiled.py). MODELLED, NOT MEASURED.

RETILED_FORWARD = ("_r_sq_totals", "_r_scan", "_r_pi", "_r_scan", "_r_out")
RETILED_BACKWARD = ("_r_grad_totals", "_r_scan", "_r_logit_grad", "_r_scan", "_r_grad_w")
# The scans of one call, in launch order: (the totals, the carries, mode)
RETILED_SCANS = {"forward": (("tS", "cS", "prefix"), ("tMN", "cMN", "prefix")),
                 "backward": (("tG", "cG", "suffix from"), ("tGS", "cGS", "suffix after"))}
# What each chunk launch moves in HBM (each tensor once; sizes in _retiled_sizes), reads again
# from L2 as today's kernels do (dL/dw's programs of batch row 0: every row's R), and "reread": the
# chunk B1 walks a second time (w, g, Pi), rows read a moment before by the same program: priced
# at the copy rate, as if none of it were still in L2 (its chunks in flight, ~50 MB at B1 T16K with
# 4 programs an SM, are about the L2's size), where an L2 hit costs less. The per-token scalars (u,
# Pi, y, R) a program reads row by row are 4 bytes a head a row, their 128-byte lines used over 32
# rows: the model takes them as read once (L1 hits). Both are assumptions a GPU must check.
RETILED_TRAFFIC = {
    "_r_sq_totals": dict(read=("w",), write=("tS",), again=(), reread=()),
    "_r_pi": dict(read=("w", "cS", "bias"), write=("u", "pi", "tMN"), again=(), reread=()),
    "_r_out": dict(read=("w", "pi", "cMN"), write=("out",), again=(), reread=()),
    "_r_grad_totals": dict(read=("w", "g", "pi", "cMN"), write=("y", "tG"), again=(), reread=("w", "g", "pi")),
    "_r_logit_grad": dict(read=("w", "y", "pi", "u", "cS", "cG"), write=("R", "gtemp", "tGS"), again=(), reread=()),
    "_r_grad_w": dict(read=("w", "g", "pi", "R", "cS", "cMN", "cG", "tG_m", "cGS", "tGS", "gtemp"),
                      write=("dw", "dtemp", "dbias"), again=("R_batch",), reread=()),
}
# What one program does a row: its reductions across threads (a sum over a head's features, a
# reduction over the heads), and its divisions a value. No token-axis scan: the running sums are
# in-thread adds, which the model prices at nothing (nor the (hi, lo) sums of B2 and B3: ~20 more
# fp32 operations a value, ALU the model has no term for). A row's reduction is counted as
# (values a thread) / 16 of one the model was fitted to (a 4-warp program's (32, 64) bf16 tile: 16
# values a thread, two rows a thread to shuffle where a bf16 row has one): an assumption, not a fit.
RETILED_WORK = {
    "_r_sq_totals": dict(row_sums=0, divs=0),
    "_r_pi": dict(row_sums=3, divs=1),  # u's sum over features; the softmax's max and sum over heads
    "_r_out": dict(row_sums=0, divs=1),  # n / (n + M)
    "_r_grad_totals": dict(row_sums=2, divs=2),  # dL/dN (first walk), y (second) over features; D in each walk
    "_r_logit_grad": dict(row_sums=2, divs=1),  # the carry part over features, the softmax backward over heads; A
    "_r_grad_w": dict(row_sums=0, divs=2),  # A and D (dpos_bias's batch sums: one tile a batch row, row 0)
}
FITTED_VALUES_PER_THREAD = 16  # of the tiles SUM_S was fitted to


def retiled_geometry(T, p, H, kernels, element_size=2):
    """How the re-tiled kernels cut a row of T tokens and H heads of width p (w of element_size
    bytes): nC chunks of BT tokens; each program's row tile (HP, P) (heads and width padded to
    powers of two) over warps for one VECTOR_BYTES vector a thread ("values": 8 bf16, 4 fp32),
    "fits" where MAX_WARPS warps hold the row; the scans' CB chunk totals a step (as many as the
    row has, up to SCAN_CHUNKS), SB columns a program, their warps and steps."""
    HP, P = next_power_of_2(H), next_power_of_2(p)
    BT = kernels["BLOCK_T"]
    nC = cdiv(max(T, 1), BT)
    values = kernels["VECTOR_BYTES"] // element_size
    warps = min(kernels["MAX_WARPS"], max(1, HP * P // (32 * values)))
    CB = min(kernels["SCAN_CHUNKS"], next_power_of_2(nC))
    SB = kernels["SCAN_COLUMNS"]
    scan_warps = min(8, max(1, CB * SB // kernels["SCAN_VALUES_PER_WARP"]))
    return dict(BT=BT, HP=HP, P=P, EVEN_P=P == p, nC=nC, values=values, warps=warps,
                fits=HP * P <= kernels["MAX_WARPS"] * 32 * values, CB=CB, SB=SB, scan_warps=scan_warps,
                scan_steps=cdiv(nC, CB))


def _retiled_sizes(B, H, T, p, dtype, bias_width, nC):
    """Bytes of every tensor a re-tiled launch moves (RETILED_TRAFFIC's names)."""
    f32 = 4
    scalar = B * H * T * f32  # u, Pi, y, R
    per_value = B * nC * H * p * f32  # a chunk array of (B, nC, H p): tS, cS, cGS
    with_heads = B * nC * (H * p + H) * f32  # (B, nC, H p + H): tMN, cMN, cG
    w = B * H * T * p * torch.empty((), dtype=dtype).element_size()
    return dict(w=w, g=w, out=w, dw=w, u=scalar, pi=scalar, y=scalar, R=scalar, bias=H * T * f32,
                tS=per_value, cS=per_value, cGS=per_value, tGS=2 * per_value, tMN=with_heads, cMN=with_heads,
                tG=2 * with_heads, tG_m=2 * per_value, cG=with_heads, gtemp=B * nC * H * f32, dtemp=H * f32,
                dbias=H * (bias_width or T) * f32, R_batch=(B - 1) * H * T * f32)


def retiled_plan(kernels, B, H, T, p, dtype=torch.bfloat16, bias_width=None):
    """The launches of one causal forward and backward of the re-tiled kernels, in order, in
    plan_for's terms (kernel, grid, warps, HBM and L2 bytes, what a program does), for
    modelled_time_s. A chunk launch: B * nC programs of `warps`, each BT rows of an (HP, P) tile
    ("values": BT * HP * P), "sums" its row reductions as RETILED_WORK counts them; a scan: a
    program per batch row and SB columns of the totals, its dependent steps. "reread": the bytes a
    launch reads a second time (B1's second walk), priced at the copy rate."""
    geo = retiled_geometry(T, p, H, kernels, torch.empty((), dtype=dtype).element_size())
    sizes = _retiled_sizes(B, H, T, p, dtype, bias_width, geo["nC"])
    programs, share = B * geo["nC"], geo["values"] / FITTED_VALUES_PER_THREAD
    plan = []
    for direction, names in (("forward", RETILED_FORWARD), ("backward", RETILED_BACKWARD)):
        scans = iter(RETILED_SCANS[direction])
        for name in names:
            if name == "_r_scan":
                tot, carry, mode = next(scans)
                columns = sizes[carry] // (B * geo["nC"] * 4)
                plan.append(dict(kernel=name, direction=direction, mode=mode, carries=carry,
                                 grid=B * cdiv(columns, geo["SB"]), warps=geo["scan_warps"], read=sizes[tot],
                                 write=sizes[carry], l2_read=0, tiles=0, scans=0, sums=0, divs=0, values=0,
                                 steps=geo["scan_steps"]))
                continue
            t, w = RETILED_TRAFFIC[name], RETILED_WORK[name]
            plan.append(dict(kernel=name, direction=direction, grid=programs, warps=geo["warps"],
                             read=sum(sizes[k] for k in t["read"]), write=sum(sizes[k] for k in t["write"]),
                             l2_read=sum(sizes[k] for k in t["again"]), reread=sum(sizes[k] for k in t["reread"]),
                             tiles=programs, scans=0,
                             sums=geo["BT"] * w["row_sums"] * share, divs=w["divs"],
                             values=geo["BT"] * geo["HP"] * geo["P"], steps=0))
    return plan
