"""zerospec.cluster."""
