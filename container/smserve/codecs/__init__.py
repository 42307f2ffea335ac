"""Bytes to arrays and back: KServe v2 with Triton's binary extension (v2/), numeric
text records (records/), .npy and .npz, the simple types' decode into records and
encode (simple.py; protocols/ fits the records to a model's inputs), answers as text
(textout.py), gzip and deflate request bodies. Pure functions over bytes and numpy
arrays: no Flask, no torch, no server; work that runs long is handed an offload callable.

May import: core/ and the base modules (settings, errors, logs, metrics, memo, files).
"""
