"""Cutting: a Keras model into its bricks, a corpus into its unique bricks.

`loading` reads a model's config, `graph` walks it into a DAG of layer
calls, `split` cuts the DAG into runs of at most G calls, `signature` says
when two bricks are the same, `replay` and `brick` rebuild a brick as a
fresh `keras.Model`, and `decompose` ties them together. `fidelity` checks
the bricks against the model, `suite` keeps the unique bricks of a set of
models, `synthetic` makes inputs that a model or brick accepts, and
`user_modules` imports the user's own layers before a model is read.
"""
