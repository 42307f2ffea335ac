"""The model file and what comes out of it: which artifact a folder holds and what is
wrong with it (artifacts), a torch.export archive's weights (weights), inputs and outputs
read off the model (derived), the torch model on its device, its inputs made tensors and
any output tensor a numpy array (torch_model), torch.compile and the warm-up
(compiling), pinned host buffers (staging), what torch caches per model (torch_caches).

May import: engine/runtime/ and the layers below the engine.
"""
