"""Command-line tools of dlbricks_tf (thin absl apps over the package)."""
