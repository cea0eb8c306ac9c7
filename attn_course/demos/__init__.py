"""Tiny synthetic tasks and models that train in seconds on a CPU, one module per lesson."""
