"""zerospec.optim."""
