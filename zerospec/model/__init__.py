"""The model the stages train: a GPT (its config and family, layers, Megatron-LM slicing for
model parallelism, the vocabulary-parallel head), its sharding units, the paper's presets, Hugging
Face configs read as their owner reads them, and the synthetic data."""
