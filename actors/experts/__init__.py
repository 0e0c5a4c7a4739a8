"""Experts: anything that answers a ``GenerateRequest`` with candidate sources or a decline."""
