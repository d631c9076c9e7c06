"""``zerospec report``: every ZeRO stage on N virtual GPUs, the seed's tables and figures, measured."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from . import argtypes as T


HELP = "run every stage on N virtual GPUs; print the measured tables, write figures"


def add_parser(sub) -> None:
    from ..model.family import SMALL
    from ..report.choices import TABLES, VARIANTS
    from ..render.format import FORMATS
    p = sub.add_parser("report", help=HELP,
                       description=__doc__.splitlines()[0])
    T.accept_negative_values(p)
    p.add_argument("--ranks", type=T.positive_int, default=32, help="virtual GPUs N (default 32)")
    p.add_argument("--stages", type=T.choice_list(VARIANTS, "stage"), default=list(VARIANTS),
                   help="comma list of 0, 1, 1ar, 2, 3 (1ar: ZeRO-1 that all-reduces gradients); "
                        "default all")
    p.add_argument("--steps", type=T.positive_int, default=3, help="training steps (default 3)")
    g = p.add_argument_group("model size (tiny GPT)")
    g.add_argument("--layers", type=T.positive_int, default=SMALL.n_layer, help=f"default {SMALL.n_layer}")
    g.add_argument("--embd", type=T.positive_int, default=SMALL.n_embd,
                   help=f"width d, default {SMALL.n_embd}")
    g.add_argument("--heads", type=T.positive_int, default=SMALL.n_head,
                   help=f"default {SMALL.n_head}")
    g.add_argument("--vocab", type=T.positive_int, default=SMALL.vocab_size,
                   help=f"default {SMALL.vocab_size}")
    g.add_argument("--seq", type=T.positive_int, default=SMALL.block_size,
                   help=f"sequence length, default {SMALL.block_size}")
    g.add_argument("--micro-batch", type=T.positive_int, default=2,
                   help="sequences per GPU per step (default 2)")
    s = p.add_argument_group("scaled table (closed forms)")
    s.add_argument("--scale-params", type=T.count, default=7_500_000_000,
                   help="Ψ of the projection (default 7.5e9, the seed's and Figure 1's model)")
    s.add_argument("--gpu-mem", type=T.memory, default=32 * 10**9, help="GPU memory (default 32GB)")
    s.add_argument("--bandwidth", type=T.bandwidth, default=50 * 10**9,
                   help="per-GPU bandwidth (default 50GB/s)")
    s.add_argument("--units", choices=("GB", "GiB"), default="GB", help="GB = 10^9 B (default), GiB = 2^30 B")
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=FORMATS, default="markdown", help="default markdown")
    o.add_argument("--tables", type=T.choice_list(TABLES, "table"), default=list(TABLES),
                   help=f"comma list of {', '.join(TABLES)} (default all)")
    o.add_argument("--out", type=Path, default=Path("zerospec-report"),
                   help="directory for figures (PNG, SVG) and the report file (default ./zerospec-report)")
    o.add_argument("--no-figures", action="store_true", help="print the tables only; write nothing")
    o.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..model.gpt import GPTConfig
    from ..report.measure import ReportConfig, measure
    from ..render.format import render
    from ..report.writeup import build_tables, header
    if args.embd % args.heads:   # in the flags' names, not GPTConfig's n_embd/n_head
        raise ValueError(f"--embd {args.embd} must be divisible by --heads {args.heads}: every "
                         f"head gets --embd/--heads dimensions")
    model = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers,
                      n_head=args.heads, n_embd=args.embd)
    cfg = ReportConfig(ranks=args.ranks, variants=tuple(args.stages), steps=args.steps, model=model,
                       micro_batch=args.micro_batch, scale_params=args.scale_params,
                       gpu_bytes=args.gpu_mem, bandwidth=args.bandwidth, unit=args.units)
    if not args.no_figures:   # before the minute of measuring: a bad --out fails at once
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {args.out}: cannot create that directory ({exc.strerror})") from None
    m = measure(cfg, quiet=args.quiet, c30=not args.no_figures)   # traces for the figures
    tables = build_tables(m, args.tables)
    meta = {"ranks": cfg.ranks, "steps": cfg.steps, "stages": list(cfg.variants),
            "psi": m.runs[0].result.psi, "model": dataclasses.asdict(model),
            "micro_batch": cfg.micro_batch, "measure_seconds": m.seconds}
    text = render(tables, args.format, header=header(m), meta=meta)
    sys.stdout.write(text)
    if not args.no_figures:
        from ..report.figures import write_figures
        ext = {"markdown": "md", "json": "json", "csv": "csv"}[args.format]
        (args.out / f"report.{ext}").write_text(text)
        figs = write_figures(m, args.out)
        if not args.quiet:
            print(f"zerospec: wrote report.{ext} and {len(figs)} figure files to {args.out}/",
                  file=sys.stderr)
    if not args.quiet:
        print(f"zerospec: measured {len(m.runs)} run{'s' * (len(m.runs) != 1)} on {cfg.ranks} virtual GPUs in {m.seconds:.1f} s",
              file=sys.stderr)
    return 0
