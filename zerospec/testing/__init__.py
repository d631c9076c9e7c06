"""Oracles, peers and hooks for the tests and benchmarks: the single-process reference, the
DeepSpeed and HSDP peers, fault and schedule hooks. The library itself never imports this
package."""
