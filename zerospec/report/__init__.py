"""zerospec.report: the seed write-up's report (memory, communication, equivalence, FLOPs,
wall-clock, ZeRO-R's options, the 7.5B projection), measured in one run, with its figures."""
