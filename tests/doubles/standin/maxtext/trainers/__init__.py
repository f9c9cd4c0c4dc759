"""Stand-in package (see tests/doubles/standin/README.md)."""
