"""How long a test lets a thread-cluster rank take to arrive where its peers wait, in a test that
waits out a :class:`~zerospec.runtime.errors.CollectiveTimeout` on purpose (one rank stuck).

The arriving ranks do microseconds of work between hand-offs; what a loaded machine adds is the
time a woken thread waits for a CPU and for the GIL. Linux's EEVDF scheduler (6.6 on) runs a woken
task after at most the runnable tasks ahead of it have each used a base slice, 0.75 ms ×
(1 + log2 CPUs): 1.5 ms on 2 CPUs (kernel/sched/fair.c, ``sysctl_sched_base_slice``). Reckoning
50 runnable tasks per CPU (a load average of 100 on two cores, some 25 times what three agents'
test runs make) and CPython's switch interval (5 ms, ``sys.getswitchinterval()``) for the GIL, a
wake-up takes at most 50 × 1.5 + 5 = 80 ms. A timed-out cluster of three ranks needs three
wake-ups before the stuck rank holds the baton (each rank's first turn): 240 ms. Twice that."""
from __future__ import annotations

ARRIVAL_SECONDS = 0.5
