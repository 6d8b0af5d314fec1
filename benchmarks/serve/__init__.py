"""Serving benchmark (``dhisparse bench serve``): see ``benchmarks.serve.run``."""
