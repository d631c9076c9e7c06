"""The paper's evaluation numbers as data: the appendix run tables, Table 4, and the text's figures.

These are the paper's *printed* values, each row with where it is printed (the sources are those of
docs/claims.md: [A] arXiv:1910.02054 v3, [SC] the SC'20 version and its artifact appendix). They are
not results of zerospec: the tests in tests/claims/test_tables_evaluation.py check the paper's
arithmetic and internal consistency on them (C39, C41, C47, C51–C53), and the appendix's DP
baselines are the shapes at which stage 0's peak is measured (C5, C55).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

B = 10**9            # the paper's "B" of parameters
T = 10**12           # and of TFlops / PFlops: decimal units throughout (docs/claims.md, Symbols)


@dataclasses.dataclass(frozen=True)
class Run:
    """One row of an appendix table: a model and how it was run (C52)."""
    size: str            # the label as printed: "1.5B", "1.16B"
    who: str             # "ZeRO" or "Baseline"
    gpus: int
    mp: int              # model-parallel degree N_m
    layers: int
    hd: int              # hidden width
    heads: int
    batch_per_gpu: int
    total_batch: int
    source: str          # table and figure it comes from

    @property
    def n_d(self) -> int:
        """The data-parallel degree: GPUs / MP (C52, C53)."""
        return self.gpus // self.mp

    @property
    def params(self) -> Fraction:
        """The printed label in parameters: "1.16B" -> 1.16e9."""
        return params(self.size)


def params(label: str) -> Fraction:
    """A printed model size in parameters: "1.16B" -> 1.16e9, "1T" -> 1e12."""
    return Fraction(label[:-1]) * {"B": B, "T": T}[label[-1]]


def _rows(source: str, rows: str, **fixed) -> tuple[Run, ...]:
    """Parse a whitespace table whose columns are Run's fields not given in ``fixed``, in order."""
    names = [f.name for f in dataclasses.fields(Run) if f.name not in fixed and f.name != "source"]
    out = []
    for line in rows.strip().splitlines():
        cells = dict(zip(names, line.split()))
        out.append(Run(**{k: v if k in ("size", "who") else int(v) for k, v in cells.items()},
                       **fixed, source=source))
    return tuple(out)


# [SC] AE appendix Table 1 (arXiv Table 5): throughput against Megatron-LM, arXiv Fig. 2.
FIGURE2 = _rows("[SC] appendix Table 1 / arXiv Table 5 (Fig. 2)", """
1.5B ZeRO     400   1  48 1600  16 24 9600
1.5B Baseline 400   2  48 1600  16 16 3200
8B   ZeRO     400   4  72 3072  24 64 6400
8B   Baseline 400   8  72 3072  24  8  400
20B  ZeRO     400   4  98 4096  32 32 3200
20B  Baseline 400  16  98 4096  32  4  100
40B  ZeRO     400   4  88 6144  32 12 1200
40B  Baseline 384  32  88 6144  64  4   48
60B  ZeRO     400  16 132 6144  32 64 1600
60B  Baseline 384  64 132 6144  64  4   24
80B  ZeRO     400  16 100 8192  64 32  800
80B  Baseline 384 128 100 8192 128  4   12
100B ZeRO     400  16 125 8192  64 32  800
100B Baseline 384 128 125 8192 128  2    6
120B ZeRO     400  16 150 8192  64 24  600
120B Baseline 384 128 150 8192 128  2    6
140B ZeRO     400  16 175 8192  64 16  400
140B Baseline 384 128 175 8192 128  2    6
170B ZeRO     400  16 212 8192  64 12  300
170B Baseline 256 256 212 8192 256  2    2
""")

# [SC] appendix Table 2 (arXiv Table 6): super-linear scaling of a 60B model, arXiv Fig. 3.
FIGURE3 = _rows("[SC] appendix Table 2 / arXiv Table 6 (Fig. 3)", """
60B ZeRO  64 16 75 8192 32 16   64
60B ZeRO 128 16 75 8192 32 48  384
60B ZeRO 256 16 75 8192 32 48  768
60B ZeRO 400 16 75 8192 32 64 1600
""")

# [SC] appendix Table 3 (arXiv Table 7): DP only (no MP) on 128 GPUs, arXiv Fig. 4.
FIGURE4 = _rows("[SC] appendix Table 3 / arXiv Table 7 (Fig. 4)", """
1.5B  ZeRO     34 1920 16 24 3072
2.5B  ZeRO     54 1920 16 24 3072
4B    ZeRO     64 2304 24 16 2048
6B    ZeRO     52 3072 24 12 1536
8B    ZeRO     72 3072 24  8 1024
10B   ZeRO     50 4096 32  6  768
11B   ZeRO     54 4096 32  4  512
12B   ZeRO     58 4096 32  4  512
13B   ZeRO     62 4096 32  2  256
1.16B Baseline 24 1920 16  8 1024
1.38B Baseline 40 1536 16  1  128
""", gpus=128, mp=1)

# [SC] appendix Table 4 (arXiv Table 8): max model size per ZeRO configuration C1..C5, arXiv Fig. 6.
# Listed in the paper's order, which is not C1..C5 (C47 names 40B C1, 60B C2, 140B C4, 150B C5).
FIGURE6 = _rows("[SC] appendix Table 4 / arXiv Table 8 (Fig. 6)", """
40B  ZeRO  50 8192 32
60B  ZeRO 132 6144 64
140B ZeRO 175 8192 64
150B ZeRO 187 8192 64
50B  ZeRO  62 8192 32
""", gpus=400, mp=16, batch_per_gpu=16, total_batch=400)

# [SC] appendix Table 5 (arXiv Table 9): max cached memory, arXiv Fig. 7.
FIGURE7 = _rows("[SC] appendix Table 5 / arXiv Table 9 (Fig. 7)", """
40B  ZeRO  50 8192 32 16 400
100B ZeRO 125 8192 64 32 800
""", gpus=400, mp=16)

# [SC] appendix Table 6 (arXiv Table 10): throughput per configuration C1..C5, arXiv Fig. 8.
FIGURE8 = _rows("[SC] appendix Table 6 / arXiv Table 10 (Fig. 8)", """
60B  ZeRO 128 16  75 8192 64  2  16
60B  ZeRO 128 16  75 8192 64  4  32
60B  ZeRO 128 16  75 8192 64 32 256
60B  ZeRO 128 16  75 8192 64 32 256
60B  ZeRO 128 16  75 8192 64  8  64
170B ZeRO 400 16 212 8192 64 12 300
""")

APPENDIX = FIGURE2 + FIGURE3 + FIGURE4 + FIGURE6 + FIGURE7 + FIGURE8
MAX_GPUS = 400       # [A] §10.1: 25 DGX-2 nodes of 16 V100s (C40)

# C46, Table 3 ([A] §10.5, [SC]): the ZeRO configurations as printed, config -> (ZeRO-DP, ZeRO-R).
TABLE3 = {"C1": ("P_os", "C_B + M_D"), "C2": ("P_os", "C_B + M_D + P_a"),
          "C3": ("P_os+g", "C_B + M_D"), "C4": ("P_os+g", "C_B + M_D + P_a"),
          "C5": ("P_os+g", "C_B + M_D + P_a+cpu")}
CONFIG_STAGE = {c: {"P_os": 1, "P_os+g": 2}[dp] for c, (dp, _) in TABLE3.items()}   # ZeRO-DP's stage

# C47, [A] §10.5: the largest model each ZeRO configuration trains (Fig. 6), as printed. The text
# names C1's, C2's, C4's and C5's; C3's is inferred: the one run of Figure 6 left, 50B.
MAX_SIZE_BY_CONFIG = {"C1": "40B", "C2": "60B", "C3": "50B", "C4": "140B", "C5": "150B"}

# Table 4 as the arXiv v3 prints its Figure 2 column (C51): (label, layers, hd). The 4096 of the
# 40B–60B row is an erratum: the appendix (FIGURE2) and [SC] Table IV give 6144.
TABLE4_ARXIV = (("1.5B", (48,), 1600), ("8B", (72,), 3072), ("40B–60B", (88, 132), 4096),
                ("80B–170B", (100, 125, 150), 8192), ("140B–170B", (175, 212), 8192))
TABLE4_SC = (("1.5B", (48,), 1600), ("8B", (72,), 3072), ("20B", (98,), 4096),
             ("40B–60B", (88, 132), 6144), ("80B–170B", (100, 125, 150, 175, 212), 8192))

# C39, [A] §9: the compute gap to a 1T model.
BERT_LARGE_MINUTES = 67          # on a 1024-GPU DGX-2H cluster
BERT_LARGE_PARAMS = 330 * 10**6
COMPUTE_RATIO = 3000             # "about 3000x" the compute per sample (1T / 330M)
DAYS_FOR_1T = 140                # "about 140 days" on the same hardware

# C41, [A] abstract, §1, §10.2: ZeRO-100B's headline throughput on 400 V100s.
TFLOPS_PER_GPU_100B = 38         # "over 38 TFlops/GPU" for 100B
AGGREGATE_PFLOPS = 15            # "over 15 PFlops" aggregate; 15 PFlops sustained on 8B–100B
PEAK_FRACTION = Fraction(30, 100)  # "over 30% of peak"
V100_FP16_PEAK_TFLOPS = 125      # V100 tensor-core fp16 peak (NVIDIA's datasheet; docs/claims.md C41)
MAX_MODEL = 170 * B              # "170B", "over 8x" the state of the art
SOTA_MODEL = 20 * B              # C38: Megatron-LM's largest at acceptable throughput, 16–20B
MEGATRON_40B_TFLOPS = 5          # C38: Megatron-LM's 40B over two DGX-2 nodes, "about 5 TFlops/GPU"
SPEEDUP_OVER_BASELINE = 10       # C41: "up to 10x" over the Megatron-LM baseline
