"""The machine a timing is taken on, and the settings it is taken with.

`settings` holds the run settings (batch, threads, backend), part of the
store's key; `fingerprint` identifies the machine, the rest of the key;
`process` sets up TensorFlow's thread pools and reads oneDNN's state.
"""
