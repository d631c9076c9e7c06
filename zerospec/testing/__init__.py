"""zerospec.testing."""
