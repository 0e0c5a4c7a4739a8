"""Tests of diagnosis."""
