"""zerospec.runtime."""
