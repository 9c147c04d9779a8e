"""Processes, run directories, checkpoints: the one place that wires the parts together."""
