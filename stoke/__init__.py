"""stoke: predictable, cheap GPU inference and training provisioning (CLI layer)."""

__version__ = "0.1.0"
