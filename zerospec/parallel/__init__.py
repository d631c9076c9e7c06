"""Model parallelism: Megatron-LM's tensor-parallel operators over a grid's MP group."""
