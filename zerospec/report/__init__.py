"""zerospec.report."""
