"""Command-line entry points run from a checkout (`python -m tools.X`)."""
