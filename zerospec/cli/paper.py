"""``zerospec paper``: one of the paper's evaluation figures or tables, reproduced next to its values.

    python -m zerospec paper --figure 6            # Figure 6's table, and paper_figure6.png/.svg
    python -m zerospec paper --figure 7            # Figure 7's cached memory (the allocator model)
    python -m zerospec paper --table 3 --format csv
    python -m zerospec paper --figure 2 --no-figures

Every run is a meta step at the appendix's shape, GPU count, MP degree and batch, timed on a
spec-sheet DGX-2 model (spec/evaluation.md); a figure takes 5–60 s on two cores.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


HELP = ("reproduce one of the paper's evaluation figures or tables (meta steps timed on a DGX-2 "
        "model) next to its values")


def add_parser(sub) -> None:
    from ..render.format import FORMATS
    from ..evaluation import FIGURES, TABLES
    p = sub.add_parser("paper", help=HELP,
                       description=__doc__.splitlines()[0].replace("``", ""))
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--figure", type=_choice(FIGURES, "--figure"),
                      help=f"one of {', '.join(map(str, FIGURES))}")
    what.add_argument("--table", type=_choice(TABLES, "--table"),
                      help=f"one of {', '.join(map(str, TABLES))}")
    p.add_argument("--format", choices=FORMATS, default="markdown", help="default markdown")
    p.add_argument("--out", type=Path, default=Path("zerospec-paper"),
                   help="directory for the figure (PNG, SVG); default ./zerospec-paper")
    p.add_argument("--no-figures", action="store_true", help="print the tables only; write nothing")


def _choice(accepted: tuple[int, ...], flag: str):
    def convert(text: str) -> int:
        if not text.strip().isdigit() or int(text) not in accepted:
            raise argparse.ArgumentTypeError(
                f"{flag} must be one of {', '.join(map(str, accepted))} (the ones reproduced), "
                f"got {text!r}")
        return int(text)
    convert.__name__ = flag.lstrip("-")
    return convert


def run(args: argparse.Namespace) -> int:
    from ..render.format import render
    from ..evaluation import tables as pf
    kind, n = ("figure", args.figure) if args.figure is not None else ("table", args.table)
    drawing = kind == "figure" and not args.no_figures
    if drawing:                # before the seconds of measuring: a bad --out fails at once
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--out {args.out}: cannot create that directory "
                             f"({exc.strerror})") from None
    tables = pf.BUILD[kind, n]()
    header = [f"# The paper's {kind} {n}, reproduced (zerospec; spec/evaluation.md)"]
    sys.stdout.write(render(tables, args.format, header=header, meta={kind: n}))
    if drawing:
        from ..evaluation.plots import draw
        paths = draw(n, args.out)
        print(f"zerospec: wrote {', '.join(p.name for p in paths)} to {args.out}/", file=sys.stderr)
    return 0
