"""On-demand benchmarks (not collected by pytest): `uv run python -m benchmarks.<name>`."""
