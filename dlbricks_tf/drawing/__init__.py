"""Drawing: the charts and TensorBoard output that reports and analyses share.

`charts` is the canvas every PNG chart is drawn on (and heatmaps),
`bar_charts` draws bars, `scatter_charts` each model's estimate against its
measurement, and `summaries` writes TensorBoard images, tables, scalars,
HParams and graphs. They import neither `reporting` nor `analyzing`: both
draw with them. None imports TensorFlow at import time.
"""
