"""`cnninfer bench`: the GPU algorithms against PyTorch (gpu), the CPU backend against onnxruntime
(cpu), a streamed file (stream), and servers under load (serve, litserve)."""
