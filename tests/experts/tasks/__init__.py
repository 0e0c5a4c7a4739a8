"""Whole-model reference tasks of the template expert's tests (KernelBench format, written here)."""
