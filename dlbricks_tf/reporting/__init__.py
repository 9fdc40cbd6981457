"""Reporting: a job's results as Markdown tables, charts and TensorBoard runs.

`report` formats the Markdown tables, `board` writes the TensorBoard views,
`compare` sets each model's estimates on every machine and backend side by
side, and `summaries` (TensorBoard) and `charts` (PNG) are the writers they
share with the corpus analysis.
"""
