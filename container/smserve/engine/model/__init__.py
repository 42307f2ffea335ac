"""The model file and what comes out of it: which artifact a folder holds and what is
wrong with it (artifacts), a torch.export archive's weights (weights), inputs and outputs
read off the model (derived), any tensor as a numpy array (conversion), pinned host
buffers (staging), what torch caches per model (torch_caches).

May import: engine/runtime/ and the layers below the engine.
"""
