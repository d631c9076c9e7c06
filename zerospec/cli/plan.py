"""``zerospec plan``: will it fit, and what will it cost on the wire? Closed forms for any model."""
from __future__ import annotations

import argparse
import sys

from . import argtypes as T


def add_parser(sub) -> None:
    from ..paper.estimators import ESTIMATOR_NAMES
    from ..report.format import FORMATS
    p = sub.add_parser("plan", help="per-GPU model states, fit, comm and time per stage for any Ψ and N; "
                                    "the paper's Table 1 and 2",
                       description=__doc__.splitlines()[0])
    T.accept_negative_values(p)
    p.add_argument("--params", type=T.list_of(T.plan.parse_count, "parameter count"), default=None,
                   help="Ψ, e.g. 7.5e9 or 7.5B; a comma list is allowed (default 7.5e9; with "
                        "--table1 the paper's 7.5B,128B,1T)")
    p.add_argument("--gpus", type=T.list_of(T.plan.parse_gpus, "GPU count"), default=None,
                   help="data-parallel GPUs N_d; a comma list is allowed (default 64; with --table1 "
                        "1,4,16,64,256,1024)")
    p.add_argument("--gpu-mem", type=T.memory, default=32 * 10**9,
                   help="memory per GPU with its unit: 32GB (default, decimal as the paper), 80GiB")
    p.add_argument("--bandwidth", type=T.bandwidth, default=50 * 10**9,
                   help="per-GPU bandwidth: 50GB/s (default), 25GiB/s, 400Gbps")
    p.add_argument("--stage", type=T.list_of(T.plan.parse_stage, "stage"), default=[0, 1, 2, 3],
                   help="comma list of stages 0-3 (default all)")
    p.add_argument("--estimator", type=T.choice_list(ESTIMATOR_NAMES, "estimator"),
                   default=list(ESTIMATOR_NAMES),
                   help=f"comma list of {', '.join(ESTIMATOR_NAMES)} (default all, side by side)")
    p.add_argument("--largest-layer", type=T.count, default=None,
                   help="parameters of the largest layer, for DeepSpeed's ZeRO-3 gather buffer "
                        "(default 0: not counted)")
    p.add_argument("--table1", action="store_true", help="print the paper's Table 1 layout (C15, C16)")
    p.add_argument("--table2", action="store_true", help="print the paper's Table 2 layout (C17)")
    p.add_argument("--mp", type=T.list_of(T.plan.parse_mp, "MP degree"), default=None,
                   help="model-parallel degrees for --table2 (default 1,2,4,8,16)")
    p.add_argument("--max-model", action="store_true", help="the largest Ψ that fits, per stage")
    p.add_argument("--units", choices=("GB", "GiB"), default="GB", help="GB = 10^9 B (default), GiB = 2^30 B")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="default markdown")


def run(args: argparse.Namespace) -> int:
    from ..report import plan
    from ..paper import theory
    from ..report.format import render
    tables = []
    largest = args.largest_layer or 0
    if args.table1:
        psis = args.params or list(theory.TABLE1_PSI.values())
        tables.append(plan.table1(psis, args.gpus or list(theory.TABLE1_ND), args.gpu_mem))
    if args.table2:
        n_d = (args.gpus or [64])[0]
        tables.append(plan.table2(args.mp or list(theory.TABLE2_MP), n_d, args.gpu_mem))
    if args.max_model:
        for n in args.gpus or [64]:
            tables.append(plan.max_model_table(n, args.gpu_mem, args.stage, largest, args.estimator))
    if not tables:
        for psi in args.params or [7_500_000_000]:
            for n in args.gpus or [64]:
                tables.append(plan.plan_table(psi, n, args.gpu_mem, args.bandwidth, args.stage, args.units))
                tables.append(plan.estimator_table(psi, n, args.gpu_mem, args.stage, args.units,
                                                   largest, args.estimator))
    sys.stdout.write(render(tables, args.format))
    return 0
