"""A Session's backend options, typed and checked when the Session is made, whatever the backend:
a misspelt name is a TypeError naming it, a bad value an InputError (a ValueError)."""
import dataclasses
from dataclasses import dataclass

from .errors import InputError

# The names the command line offers, here so that naming them imports no engine (NumPy, the GPU
# package): the GPU package's registries hold the same names (tests/test_cli.py checks).
AUTO = "auto"  # --conv-algo: the first of ALGORITHMS that can run the model on the GPU at hand
ALGORITHMS = ("fused-wgmma", "fused-tc", "implicit-wgmma", "implicit-tc", "fused", "unroll",
              "fused-certified")  # pipelines.ALGORITHMS, in auto's order of preference
CERTIFIED = "fused-certified"  # --precision certified's path
GEMMS = ("wgmma", "tf32x3", "blocked", "tiled")  # launch.GEMMS
TILE_WIDTHS = (8, 16, 32, 64, 128)  # every tile width of launch.GEMMS
PRECISIONS = ("exact", "certified")  # --precision; not given: by the run where --conv-algo is auto (pipelines.choose)
CERTIFY_FROM = 5120  # the default certifies runs of this many images or more (pipelines.FusedCertified)
BACKENDS = ("auto", "cuda", "cpu")
DESCRIBED_GPUS = ("A100", "H100", "H200", "L4", "T4")  # `plan --gpu`: gpu.device.KNOWN
DECODE_MODES = ("auto", "host", "gpu")
# CUDA streams by default: testfull's 10,000 images run as 8 chunks of 1,250 all at once (H100: 0.71 ms
# GPU, 0.86-0.90 end to end; on 4 streams the fifth chunk of 2,048 was a tail: 0.75 / 0.89-0.93 ms).
STREAMS = 8


def precision_conflict(name, precision):
    """Why --conv-algo name contradicts --precision, or None."""
    if precision == "exact" and name == CERTIFIED:
        return f"--precision exact: --conv-algo {name} is the certified float16 path; leave --conv-algo at auto"
    if precision == "certified" and name not in (AUTO, CERTIFIED):
        return f"--precision certified runs --conv-algo {CERTIFIED}; --conv-algo {name} computes exactly"
    return None


@dataclass(frozen=True)
class Options:
    chunk: int = None  # images per chunk (None: the backend's own)
    readers: int = None  # reader threads (None: one per core, at most 16)
    streams: int = STREAMS
    tile_width: int = None  # --conv-algo unroll's GEMM tile
    conv_algo: str = AUTO
    gemm_algo: str = "auto"
    device: int = 0
    devices: object = None  # a list of distinct GPU numbers, or "all" (overrides device)
    fast_math: bool = False
    profile: bool = False
    decode: str = "auto"  # where a streamed file's compressed chunks are decoded: auto (see Session), host or gpu
    precision: str = None  # exact or certified (float16 where certified, the rest exact); None: by the run (pipelines.choose)

    @classmethod
    def of(cls, **given):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                            f"the options are {', '.join(sorted(names))}")
        return cls(**{k: v for k, v in given.items() if v is not None})

    def __post_init__(self):
        for name, low in (("chunk", 1), ("readers", 1), ("streams", 1), ("device", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise InputError(f"{name} must be a whole number of at least {low}, not {value!r}")
        if self.streams > 64:
            raise InputError(f"streams must be at most 64, not {self.streams}")
        if self.readers is not None and self.readers > 256:
            raise InputError(f"readers must be at most 256, not {self.readers}")
        if self.tile_width is not None and self.tile_width not in TILE_WIDTHS:
            raise InputError(f"tile_width must be one of {', '.join(map(str, TILE_WIDTHS))}, not {self.tile_width!r}")
        if self.conv_algo not in (AUTO, *ALGORITHMS):
            raise InputError(f"conv_algo must be one of {', '.join((AUTO, *ALGORITHMS))}, not {self.conv_algo!r}")
        if self.gemm_algo not in ("auto", *GEMMS):
            raise InputError(f"gemm_algo must be one of {', '.join(('auto', *GEMMS))}, not {self.gemm_algo!r}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        conflict = precision_conflict(self.conv_algo, self.precision)  # on any machine, before a GPU is asked
        if conflict:
            raise InputError(conflict)
        if self.decode not in DECODE_MODES:
            raise InputError(f"decode must be one of {', '.join(DECODE_MODES)}, not {self.decode!r}")
        if self.devices is not None and self.devices != "all":
            try:
                devices = [int(d) for d in self.devices]
            except (TypeError, ValueError):
                raise InputError(f"devices must be a list of GPU numbers or 'all', not {self.devices!r}") from None
            if not devices or min(devices) < 0:
                raise InputError(f"devices: GPU numbers must be 0 or more, got {list(self.devices)}")
            if len(set(devices)) != len(devices):
                # Two contexts on one GPU share its legacy stream: one's graph capture fails the other's calls
                raise InputError(f"devices: GPU numbers must be distinct, got {devices}")
            object.__setattr__(self, "devices", devices)
        for name in ("fast_math", "profile"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False, not {getattr(self, name)!r}")

    def backend_kwargs(self):
        """What session.create_backend takes: the host options, the GPUs, and the CUDA backend's own."""
        return dict(chunk=self.chunk, readers=self.readers, devices=self.devices or [self.device],
                    streams=self.streams, tile_width=self.tile_width, conv_algo=self.conv_algo,
                    gemm_algo=self.gemm_algo, fast_math=self.fast_math, profile=self.profile, decode=self.decode,
                    precision=self.precision)
