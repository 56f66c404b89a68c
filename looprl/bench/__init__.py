"""Benchmarks: ``python -m looprl.bench codegen`` (more subcommands as the project grows)."""
