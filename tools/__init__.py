"""Developer tools run from the repository: ``python tools/limits_table.py``."""
