"""Benchmarks: scripts that print figures, each measuring its own floor in the same run."""
