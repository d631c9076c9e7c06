"""ZeRO-Offload's closed forms (arXiv:2101.06840 §2–3), each once, with its claim id.

M is the parameter count; bytes are per M (an edge of weight 2 moves 2M bytes per step).
"""
from __future__ import annotations

import itertools
from fractions import Fraction

# B1: bytes per parameter of each model state: fp16 parameter and gradient, fp32 parameter,
# momentum and variance
STATE_BYTES = {"p16": 2, "g16": 2, "p32": 4, "m32": 4, "v32": 4}
# B1: the paper's examples, M and the model states it prints for them (GB = 10⁹ B)
B1_EXAMPLES = {"Megatron-LM 8B": (8 * 10**9, 128), "T5 11B": (11 * 10**9, 176),
               "Turing-NLG 17.2B": (Fraction(172, 10) * 10**9, 284)}

# B2: the data-flow graph of one step of mixed-precision Adam. FWD-BWD is one super-node (its
# O(M·B) compute stays on the GPU); every other node is a model state or the O(M) update.
# An edge weighs what its producer outputs: 2M for fp16, 4M for fp32. p16 feeds forward and
# backward (two 2M edges, merged into one of 4M into the super-node); the update reads g16 and the
# fp32 states and writes the fp32 states back and p16 (float2half).
NODES = ("FWD-BWD", "p16", "g16", "update", "p32", "m32", "v32")
EDGES = (("p16", "FWD-BWD", 2 * STATE_BYTES["p16"]), ("FWD-BWD", "g16", STATE_BYTES["g16"]),
         ("g16", "update", STATE_BYTES["g16"]), ("update", "p16", STATE_BYTES["p16"]),
         *((s, "update", STATE_BYTES[s]) for s in ("p32", "m32", "v32")),
         *(("update", s, STATE_BYTES[s]) for s in ("p32", "m32", "v32")))


def model_state_bytes(m) -> Fraction:
    """B1: 16M bytes, the sum of STATE_BYTES per parameter."""
    return sum(STATE_BYTES.values()) * Fraction(m)


def cut(on_cpu) -> int:
    """B2–B3: bytes per M that cross CPU↔GPU per step when the nodes ``on_cpu`` are on the CPU:
    the weights of the edges with one end on each side."""
    on_cpu = set(on_cpu)
    unknown = on_cpu - set(NODES)
    if unknown or "FWD-BWD" in on_cpu:
        raise ValueError(f"on_cpu must name nodes of {NODES[1:]} (FWD-BWD stays on the GPU), "
                         f"got {sorted(on_cpu)!r}")
    return sum(w for a, b, w in EDGES if (a in on_cpu) != (b in on_cpu))


def splits() -> dict[frozenset, int]:
    """B3: every split that offloads something (FWD-BWD on the GPU), with its cut per M."""
    movable = NODES[1:]
    return {frozenset(c): cut(c) for n in range(1, len(movable) + 1)
            for c in itertools.combinations(movable, n)}
