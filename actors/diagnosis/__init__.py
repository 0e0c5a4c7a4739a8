"""Diagnosis: turning evaluation results into typed diagnoses (rule-based, optionally refined by an LLM)."""
