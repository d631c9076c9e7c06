"""zerospec.model."""
