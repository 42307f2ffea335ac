"""The model script's contract: its hooks found and called with their errors named
(script, by AWS's PyTorch toolkit's rules: smserve/toolkit.py), a request through
input_fn, the batcher and output_fn (chain), each hook's context filled in (context),
and input_fn and output_fn in processes of their own (processes, transport).

May import: engine/runtime/, engine/model/, engine/batching/ and the layers below the engine.
"""
