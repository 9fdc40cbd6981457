"""Measuring: timing models and bricks on this machine.

`sampling` is the protocol every timer shares (options, the adaptive stop
rule, interleaved rounds), `rounds` times a whole model and its bricks side
by side with timers of either backend, `precision` says how precisely
an estimate is known from its bricks' samples, and `disturbed` which
samples a neighbour's burst slowed; none imports TensorFlow.
`timing` is the TensorFlow timer of whole models and bricks, `timing_loop`
its in-graph loops, `chain` times many bricks in one traced function,
`campaign` samples bricks until the models' estimates are precise enough,
and `memory` refuses what cannot fit before it is timed. `ort_timing` runs
the same protocol on ONNX Runtime, on the files `onnx_convert` writes;
importing it imports no TensorFlow. `steal` reads the hypervisor steal
of /proc/stat over a run (no TensorFlow either).
"""
