"""The simulated interconnect is cheap: an all-reduce costs about what summing the tensors costs.

It also says how close it runs to the memory-traffic bound: a rank-ordered sum must at least read
every rank's fp16 input (2·N·numel bytes) and write every rank's fp16 output (2·N·numel bytes);
that traffic over the copy bandwidth measured in the same run (a plain ``copy_`` of as many bytes)
is the least time any implementation could take on this machine.

Both sides get one CPU: the cluster pins its ranks to one CPU and runs each with one intra-op
thread, so the whole all-reduce runs on one core, while ``torch.stack().sum()`` on torch's default
threads took both of this machine's cores (34 ms against 53 ms on one), and the verdict hung on
whether the second core was free at that moment (1.19 and 1.72 in two runs of the same code). The
baseline on all threads is recorded and printed beside it, as a best of 5 taken after the rounds
(not alternated with ours, so noisier than the asserted ratio).
"""
from __future__ import annotations

import torch

from zerospec import VirtualCluster
from zerospec.cluster.threads import torch_threads

from conftest import best_of

N, NUMEL = 32, 1 << 20


def test_all_reduce_1m_fp16_over_32_ranks_vs_torch_sum(ratio_to, benchmark, capsys):
    """all_reduce of 1M fp16 elements on 32 ranks ≤ 1.5× a plain torch.sum over the 32 tensors,
    both on one thread (module doc)."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(NUMEL, generator=g).half() for _ in range(N)]
    work = [x.clone() for x in xs]
    cluster = VirtualCluster(N)

    def ours():
        cluster.run(lambda ctx: ctx.comm.all_reduce(work[ctx.rank]))

    def baseline():
        with torch_threads(1):            # as each rank runs (module doc)
            torch.stack(xs).sum(dim=0)

    ratio = ratio_to(ours, baseline, rounds=5)
    all_threads_s = best_of(lambda: torch.stack(xs).sum(dim=0), 5)
    # the memory-traffic bound: read N inputs + write N outputs, at the bandwidth of one copy_
    # (read + write) of the N inputs' bytes, single-threaded like the cluster's ranks
    src, dst = torch.cat(xs), torch.empty(N * NUMEL, dtype=torch.float16)
    traffic = 2 * N * NUMEL * 2                     # bytes: fp16 in, fp16 out, every rank
    with torch_threads(1):
        dst.copy_(src)
        copy_s = best_of(lambda: dst.copy_(src), 5)
    bandwidth = 2 * src.nbytes / copy_s             # bytes read + written per second
    bound_s = traffic / bandwidth
    ours_s = benchmark.stats.stats.min
    benchmark.extra_info.update(copy_GBps=bandwidth / 1e9, bound_s=bound_s,
                                over_bound=ours_s / bound_s, target=1.5,
                                all_threads_baseline_s=all_threads_s,
                                all_threads_ratio=ours_s / all_threads_s,
                                all_threads_n=torch.get_num_threads())
    with capsys.disabled():
        print(f"memory-traffic bound ({traffic / 1e6:.0f} MB at {bandwidth / 1e9:.1f} GB/s): "
              f"{bound_s * 1e3:.1f} ms; ours {ours_s * 1e3:.1f} ms = {ours_s / bound_s:.2f}× the "
              f"bound; the sum on {torch.get_num_threads()} threads {all_threads_s * 1e3:.1f} ms "
              f"({ours_s / all_threads_s:.2f}×, not asserted)")
    assert ratio <= 1.5   # issue 18
