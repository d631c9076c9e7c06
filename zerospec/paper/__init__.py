"""zerospec.paper."""
