"""Limits every codec shares, each written once."""

# numpy cannot make an array of more dimensions than this (NPY_MAXDIMS in numpy 2).
MAX_DIMS = 64
# Deepest JSON nesting a request may use: Triton's limit (PROTOCOL.md 2.6), which the
# simple JSON forms share, so one body nests as deep under either protocol.
MAX_JSON_DEPTH = 100
