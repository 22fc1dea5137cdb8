"""The certificate's earlier versions (dev/cuda/certify_early.cu: certify_kernel1-3, which read fc1's
float32-accurate sums from the fc kernel), each validated against the exact path (fused-wgmma) and the
NumPy reference, then timed beside the product's versions 4 and 5 (cuda/certify.cu). Needs a Hopper GPU:

    . .device/setup.sh && python dev/cuda/certify_early.py ../shared/data/ece408/model.hdf5 \\
        ../shared/data/ece408/testfull.hdf5 [--images 10000] [--repeats 20]

One row a version: the images its certificate leaves to the exact path, whether the labels are the
exact path's (a run whose labels differ stops the script, exit 1), agreement with the reference, and
the median GPU time of the whole certified pass on resident float32 images (CUDA events, warm-up, then
the median of --repeats). tests/test_certify_early_gpu.py runs the validation; test_kernels_compile.py
builds the file."""
import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "dev" / "cuda")]

import devbuild  # noqa: E402
from infer import reference  # noqa: E402
from infer.gpu import launch, pipelines  # noqa: E402
from infer.gpu.launch.base import ceil_div  # noqa: E402

VERSIONS = (1, 2, 3)


class EarlyCertify(launch.Certify):
    """certify_kernel1 (32 images a block, one block an SM), 2 (16 images, both stages for every image)
    and 3 (32 images, then pair_kernel1 on the pairs its first stage left), all on float32 features and
    bounds, with fc1's sums z, the scores and labels from the fc kernel."""
    source = "dev/cuda/certify_early"
    KERNELS = {1: "certify_kernel1", 2: "certify_kernel2", 3: "certify_kernel3"}
    ARG_TYPES = {1: "PPPPPPPPPi", 2: "PPPPPPPPPi", 3: "PPPPPPPPPPPi"}
    IMGS = {1: 32, 2: 16, 3: 32}
    HALVES = ()

    @staticmethod
    def shared(g, version=3):
        """certify_kernel<version>'s dynamic shared bytes (its regions and the per-image terms)."""
        small = lambda imgs: imgs * (3 * g.classes + 2)  # noqa: E731
        if version == 1:
            g_row, ncol = 16 * g.classes + 8, 16 * g.classes
            r1 = max(2 * 64 * g_row, 2 * (64 * 72 + 64 * g.hidden // 2))
            return 4 * (r1 + g.hidden * ncol + 2 * (64 * g.hidden // 2 + 32 * 64) + small(32))
        if version == 3:
            stages, q_and_slopes = 4 * (64 * 40 + 32 * g.hidden // 2), 64 * (g.hidden + 4) + 32 * g.hidden
            return 4 * (max(stages, q_and_slopes) + 32 * g.hidden + 2 * 32)
        stage, ncol = 64 * g.hidden // 2 + 16 * 68, 8 * g.classes
        r1 = max(2 * stage, 2 * (32 * 72 + 64 * g.hidden // 2), 32 * (g.hidden + 4))
        return 4 * (r1 + g.hidden * ncol + small(16) + 8 * ncol)

    @classmethod
    def defines(cls, g, version=None):
        """certify.cu's -D options for version 4 (its helpers and pair_kernel1), and versions 1-3's shared floats."""
        return dict(launch.Certify.defines(g, 4), **{f"SHARED_V{v}": cls.shared(g, v) // 4 for v in VERSIONS})

    @classmethod
    def load(cls, build, g):
        """Build certify_early.cu and put its module among build's (before a pipeline asks for it: the
        package's compiler knows only cuda/'s files)."""
        devbuild.load(build, "certify_early", tuple(sorted(cls.defines(g).items())), arch="sm_90a", fast_math=False)

    def __call__(self, stream, feat, dp, z, scores, labels, w1abs, w1h, w2, ok, n, *, pairs):
        grid = (ceil_div(n, self.IMGS[self.version]), 1)
        if self.version < 3:
            self.launch(stream, grid, (self.THREADS, 1, 1), feat, dp, z, scores, labels, w1abs, w1h, w2, ok, n, shared=self.bytes)
            return
        import pycuda.driver as cuda

        listed, columns, npairs = pairs
        cuda.memset_d32_async(npairs, 0, 1, stream)
        self.launch(stream, grid, (self.THREADS, 1, 1), feat, dp, z, scores, labels, w1abs, w2, ok, listed, columns, npairs,
                    n, shared=self.bytes)
        self.pairs(stream, n, listed, columns, npairs, dp, w1h, ok)


class EarlyCertified(pipelines.FusedCertified):
    """fused-certified with certify_kernel<VERSION>: the product's convs on float32 features and bounds
    (as for its version 4), the fc kernel's sums z, scores and labels, then the early certificate."""
    CERTIFY_VERSION = 4  # the product's float32 features and bounds
    VERSION = 3

    def __init__(self, build, g):
        super().__init__(build, g)
        self.cert = EarlyCertify(build, g, self.VERSION)

    def _layout(self, chunk):
        return super()._layout(chunk) + [("z", chunk * self.g.hidden)]

    def certify(self, stream, s, passed, labels, n):
        # The float16 pass's scores may overflow where the exact path's do not: its own flag, unread.
        self.fcs(stream, s["feat"], self.fc1, self.fc2, labels, n, s["cert_overflow"], s["scores"], s["partial"], z=s["z"])
        self.cert(stream, passed, s["dp"], s["z"], s["scores"], labels, self.w1abs, self.w1h, self.fc2, s["ok"], n,
                  pairs=(s["pairs"], s["columns"], s["npairs"]))


def pipeline(version):
    """The pipeline class certifying with `version`: 1-3 from this folder, 4 and 5 the product's."""
    if version in VERSIONS:
        return type(f"EarlyCertified{version}", (EarlyCertified,), dict(NAME=f"fused-certified-v{version}", VERSION=version))
    return type(f"Certified{version}", (pipelines.FusedCertified,), dict(NAME=f"fused-certified-v{version}",
                                                                        CERTIFY_VERSION=version))


def run(model, x, version, repeats=20, warmup=5):
    """(labels, images recomputed, median GPU ms of a whole certified pass or None where repeats is 0)
    for the certificate's `version` on float32 images x."""
    from infer.bench.gpu import _median_events
    from infer.gpu.backend import CudaBackend
    from infer.network import geometry
    from infer.plan import for_backend

    algo = pipeline(version)
    pipelines.ALGORITHMS[algo.NAME] = algo
    b = CudaBackend(conv_algo=pipelines.FusedCertified.NAME)
    try:
        if version in VERSIONS:
            EarlyCertify.load(b.build, geometry(model, x.shape, "data"))
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, dataclasses.replace(for_backend(b, model, x.shape), pipeline=algo.NAME))
        certified = b.executor.pipeline
        certified.recomputed()  # the warm-up's
        labels, _ = b.forward(host)
        recomputed = certified.recomputed()
        ms = _median_events(b.enqueue_resident, warmup, repeats) if repeats else None
        return labels, recomputed, ms
    finally:
        b.close()
        del pipelines.ALGORITHMS[algo.NAME]


def exact_labels(model, x):
    from infer.gpu.backend import CudaBackend
    from infer.plan import for_backend

    b = CudaBackend(conv_algo=pipelines.FusedWarpgroup.NAME)
    try:
        host = b.host_buffers(x.shape, np.float32)[0]
        host[...] = x
        b.prepare(model, for_backend(b, model, x.shape))
        return b.forward(host)[0]
    finally:
        b.close()


def main(argv=None):
    from infer.bench.gpu import read_all
    from infer.data import loader

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("data")
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--version", type=int, nargs="+", default=[*VERSIONS, 4, 5], choices=[*VERSIONS, 4, 5])
    args = p.parse_args(argv)
    model = loader.load_model(args.model)
    x = read_all(args.data, model, args.images)
    exact, ref = exact_labels(model, x), reference.forward(x, model)
    print(f"{len(x)} images; the exact path agrees with the reference on {np.count_nonzero(exact == ref)}")
    print(f"{'version':>8} {'recomputed':>11} {'labels':>8} {'= reference':>12} {'GPU ms':>8}")
    for v in args.version:
        labels, recomputed, ms = run(model, x, v, args.repeats)
        same = np.array_equal(labels, exact)
        timed = "-" if ms is None else f"{ms:.3f}"
        print(f"{v:>8} {recomputed:>11} {'exact' if same else 'DIFFER':>8} {np.count_nonzero(labels == ref):>12} {timed:>8}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
