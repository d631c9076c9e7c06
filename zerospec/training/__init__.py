"""zerospec.training."""
