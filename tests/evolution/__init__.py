"""Tests of evolution."""
