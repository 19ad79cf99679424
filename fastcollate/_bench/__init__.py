"""Benchmark workloads and tables: imported by the CLI (``fastcollate bench``) only, never by
``import fastcollate``."""
