"""The CUDA backend: kernels in cuda/*.cu compiled by nvcc to cubins (cached on disk), loaded and
launched through PyCUDA. Nothing here touches the GPU at import time."""
