"""One launcher per kernel: it owns its launch geometry and checks its preconditions. Every launch
goes through Launcher.launch (base.py), which records CUDA events around it when profiling. The
launchers, by kernel family: base (what all share), classic (unroll, the GEMMs, place, pool,
argmax, the implicit-GEMM convs), stage (conversions and checks of uploaded images), fused (the
fused convs and the classifier), certificate (the certified pass's), decoders (the GPU decoders'
kernels). Every launcher is reached from here too, as `launch.Fused`."""
from .base import (INT_MAX, Build, Launcher, _check_int32, _cubin, _Recording, _StandIn, ceil_div, needs_hopper,
                   prefetch, recorded, version_of)
from .certificate import Certify
from .classic import GEMMS, TILE_WIDTHS, Argmax, Conv, Gemm, GemmSpec, Place, Pool, Unroll, gemm_choice, gemm_runs_on
from .decoders import (Assemble, AssembleBlocks, BitUnshuffle, BitUnshuffleRange, BloscLz4, BloscUnshuffle,
                       DecodeCheck, FrameDecoder, InflateParts, Lz4Blocks, Lz4Index, Lzf, StreamCheck, Unshuffle, Zstd,
                       ZstdApart, _PerValueSize)
from .fused import FullyConnected, FullyConnectedWarpgroup, Fused, FusedLayout
from .stage import Check, Convert, ConvertCodes, converter

__all__ = ["INT_MAX", "Build", "Launcher", "_check_int32", "_cubin", "_Recording", "_StandIn", "ceil_div",
           "needs_hopper", "prefetch", "recorded", "version_of", "Certify", "GEMMS", "TILE_WIDTHS", "Argmax", "Conv",
           "Gemm", "GemmSpec", "Place", "Pool", "Unroll", "gemm_choice", "gemm_runs_on", "Assemble", "AssembleBlocks",
           "BitUnshuffle", "BitUnshuffleRange", "BloscLz4", "BloscUnshuffle", "DecodeCheck", "FrameDecoder",
           "InflateParts", "Lz4Blocks", "Lz4Index", "Lzf",
           "StreamCheck", "Unshuffle", "Zstd",
           "ZstdApart", "_PerValueSize", "FullyConnected", "FullyConnectedWarpgroup", "Fused", "FusedLayout", "Check",
           "Convert", "ConvertCodes", "converter"]
