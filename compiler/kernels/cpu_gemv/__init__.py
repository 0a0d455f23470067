"""The cpu target's quantized projections: GGUF weights kept as int8 codes with block scales (layout.py), multiplied
by a native XLA FFI kernel (block_q8.cc, built once per machine by native.py) on int8-quantized activations.
"""
