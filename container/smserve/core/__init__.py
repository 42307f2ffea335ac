"""The vocabulary every layer shares: the datatype table, a model's metadata, a
protocol-neutral inference request and response, a reply, a request's context for the
hooks, stateful sessions' IDs, the simple protocols' media types.

May import: errors, files, memo (nothing above them).
"""
