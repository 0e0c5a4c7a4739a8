"""Tests of the experts: the template expert and the LLM experts."""
