"""The command line: thin click commands over the library (session, loader, mnist, bench). Each
command imports what it uses: `--help` and the option checks import no engine (NumPy, the GPU
package, the CPU library)."""
import glob
import json
import os

import click

from . import __version__
from .data import defaults
from .errors import InputError
from .options import (ALGORITHMS, AUTO, BACKENDS, CERTIFY_FROM, DECODE_MODES, DESCRIBED_GPUS, GEMMS, PRECISIONS,
                      STREAMS, TILE_WIDTHS)


def parse_workers(value):
    """--workers: 'auto' or a whole number from 1 to 64."""
    if value == "auto":
        return value
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise click.BadParameter(f"'auto' or a whole number from 1 to 64, not {value!r}")
    return int(value)


def parse_devices(ctx, param, value):
    if value is None or value == "all":
        return value
    try:
        devices = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter("a comma-separated list of GPU numbers, such as 0,1, or 'all'") from None
    if len(set(devices)) != len(devices) or min(devices) < 0:
        raise click.BadParameter("GPU numbers must be distinct and not negative")
    return devices


def cuda_options(f):
    """The CUDA backend's options of `run`."""
    for option in reversed([
        click.option("--streams", type=click.IntRange(1, 64), default=STREAMS, show_default=True,
                     help="CUDA streams that chunks of images are spread over."),
        click.option("--tile-width", type=click.Choice([str(t) for t in TILE_WIDTHS]),
                     help="--conv-algo unroll: the GEMM's tile: the square tile of 'tiled' (8, 16, 32), the "
                          "rows of the TW x 128 block tile of 'blocked' and 'tf32x3' (32, 64, 128), the 128 rows "
                          "(pixels) of 'wgmma' (its columns follow the layer: 16, 32 or 64). Default: per layer, "
                          "the smallest block tile covering its output channels (16 for 'tiled')."),
        click.option("--gemm-algo", type=click.Choice(["auto", *GEMMS]), default="auto", show_default=True,
                     help="--conv-algo unroll: wgmma: Hopper's warpgroup MMA in 3xTF32, the transposed product "
                          "straight into NHWC, no placeIntoY (sm_90); tf32x3: tensor cores in 3xTF32 (sm_80+); "
                          "blocked: register-blocked "
                          "FP32; tiled: the 2016 one-output-per-thread kernel; auto: the first of these that runs "
                          "here with --tile-width."),
        click.option("--conv-algo", type=click.Choice([AUTO, *ALGORITHMS]), default=AUTO, show_default=True,
                     help="fused-wgmma: fused-tc with both convs on Hopper's warpgroup MMA (sm_90); fused-tc: "
                          "both convs and pools in one kernel, conv2 on the tensor cores in 3xTF32; implicit-wgmma: "
                          "implicit-tc on Hopper's warpgroup MMA (sm_90); implicit-tc: each conv + ReLU + pool one "
                          "implicit-GEMM kernel in 3xTF32, any shapes; fused: fused-tc on FP32 cores; unroll: the "
                          "2016 pipeline; fused-certified: --precision certified's path; auto: with no --precision, "
                          "fused-certified where it runs (see --precision), else the first of the others that can "
                          "run the model on this GPU."),
        click.option("--precision", type=click.Choice(PRECISIONS),
                     help="certified: conv2 in float16 with a bound per image; the images whose answer the bound "
                          "does not prove are recomputed exactly, so the answers are the exact path's (sm_90, "
                          "32 -> 64 channels, 128 hidden units, 10 classes; elsewhere the exact path runs, with "
                          "a notice). exact: never float16. Default: certified for runs of "
                          f"{CERTIFY_FROM} images or more (a GPU's share) uploaded a byte a pixel or less "
                          "(uint8 files, float32 files of 8-bit codes, chunks the GPU decodes) that write no "
                          "--scores (there it is "
                          "faster: docs/certified.md), exact for the rest."),
        click.option("--device", "device_ordinal", type=click.IntRange(0), default=0, show_default=True,
                     help="CUDA device number."),
        click.option("--devices", callback=parse_devices, metavar="LIST|all",
                     help="Split the images over several GPUs: 0,1 or all (overrides --device)."),
        click.option("--fast-math", is_flag=True, help="Compile the kernels with --use_fast_math."),
    ]):
        f = option(f)
    return f


def notice(line):
    click.echo(line, err=True)


class Failure(click.ClickException):
    """One line on stderr and an exit code: a library error's (InputError: 2), or 1 for a run
    that worked but failed its check (the CI regression check)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class Commands(click.Group):
    """The command group; the library's InputError becomes a Failure with its exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except InputError as e:
            raise Failure(e.message, e.exit_code) from None


@click.group(cls=Commands, context_settings=dict(help_option_names=["-h", "--help"]))
@click.version_option(__version__, prog_name="cnninfer")
def cli():
    """cnninfer: inference of the ECE408 CNN on HDF5 data, on the GPU (PyCUDA) or the CPU (native C;
    NumPy where no C compiler builds it)."""


def resolve(args):
    """[DATA...] [MODEL] [N]: a last argument that is a whole number (and no file) is N; of the
    files, the last is MODEL when there are two or more; DATA and MODEL default to the bundled
    sample and model. So `run DATA`, `run DATA 100`, `run DATA MODEL 100`, `run A B C MODEL`."""
    args, n = list(args), None
    if args and args[-1].lstrip("-").isdigit() and not os.path.exists(args[-1]):
        n = args.pop()
    elif len(args) >= 3 and not os.path.exists(args[-1]) and not glob.has_magic(args[-1]):
        raise InputError(f"N must be a whole number, got '{args[-1]}'")
    if n is not None:
        n = int(n)
    model = args.pop() if len(args) >= 2 else None
    try:
        return args or [str(defaults.sample())], model or str(defaults.model()), n
    except FileNotFoundError as e:
        raise InputError(str(e)) from None


@cli.command()
@click.argument("args", nargs=-1, metavar="[DATA]... [MODEL] [N]")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="auto: CUDA when usable here, else the CPU.")
@click.option("--chunk", type=click.IntRange(1), help="Images per chunk (default: the backend's).")
@click.option("--readers", type=click.IntRange(1, 256), help="Threads reading the data files (default: one per "
              "core, at most 16).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the two lines.")
@click.option("--per-class", is_flag=True, help="Also print each class's images, correct answers, accuracy and "
              "the class it is most often mistaken for.")
@click.option("--expect-accuracy", type=click.FloatRange(0, 1), metavar="A",
              help="Exit with code 1 when |accuracy - A| > the tolerance: a regression check for CI.")
@click.option("--tolerance", type=click.FloatRange(0), default=0.0, show_default=True, metavar="T")
@click.option("--predictions", "predictions_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the predicted labels to PATH (.npy or .csv), whole, after a successful run.")
@click.option("--scores", "scores_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the class scores (N, classes) float32 to PATH (.npy), whole, after a successful run.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar (shown on a terminal for runs over 2 s).")
@click.option("--check", is_flag=True, help="Also run the NumPy reference on the same images; exit 1 unless at "
              "least 99.95% of the predictions agree.")
@cuda_options
@click.option("--profile", is_flag=True, help="CUDA: print GPU time per kernel and copy, and the set-up steps.")
@click.option("--decode", type=click.Choice(DECODE_MODES), default="auto", show_default=True,
              help="CUDA, streamed files: where compressed chunks are decoded. host: by the reader threads; "
                   "gpu: uploaded as stored and decoded by cnninfer's kernels: deflate (gzip), LZF, Zstd, LZ4, "
                   "Bitshuffle lz4, Blosc lz4 (bit- or byte-shuffled), Blosc zstd and Blosc2 lz4 + bitshuffle "
                   "chunks, whole images or cutting them (Blosc2's: whole images), any other file refused; auto: gpu "
                   "where the file streams and the GPU decodes its chunks, but LZ4, Bitshuffle, Blosc2 and Blosc "
                   "lz4 + byte shuffle (the reader threads ran them faster), else host. `cnninfer plan` says which "
                   "and why.")
def run(args, backend, chunk, readers, as_json, per_class, expect_accuracy, tolerance, predictions_path, scores_path,
        quiet, check, streams, tile_width, gemm_algo, conv_algo, precision, device_ordinal, devices, fast_math, profile,
        decode):
    """Classify the first N images of DATA (all by default) with MODEL and print the correctness.

    DATA holds x (N, H, W, C) and one-hot y (N, classes); MODEL holds conv1, conv2, fc1, fc2.
    Several DATA files (or a quoted glob such as 'shards/*.h5') are taken in order as one data
    set; with two or more files the last is MODEL. Without MODEL the bundled model (99.5% on
    MNIST) is used; without DATA, its bundled sample of 1,000 MNIST test images.
    `elapsed` is the forward pass from images in host memory to labels in host memory.
    """
    from .data import predictions
    from . import reference, session

    data, model, n = resolve(args)
    if predictions_path:
        predictions.check_path(predictions_path)
    if scores_path:
        predictions.check_path(scores_path, formats=(".npy",))
    result = session.run(data, model, n, backend=backend, notice=notice, progress=not quiet, scores=bool(scores_path),
                        chunk=chunk, readers=readers, streams=streams, tile_width=tile_width and int(tile_width),
                        gemm_algo=gemm_algo, conv_algo=conv_algo, precision=precision,
                        devices=devices or [device_ordinal], fast_math=fast_math, profile=profile, decode=decode)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        click.echo("input dimensions = " + " x ".join(map(str, result.shape)))
        click.echo(f"Done with {result.n} queries in elapsed = {result.timing['forward']:.1f} milliseconds. "
                   f"Correctness: {result.accuracy:g}")
        if len(result.shards) > 1:
            for shard in result.per_shard():
                click.echo(f"  {shard['data']}: {shard['correct']} of {shard['n']} correct ({shard['accuracy']:g})")
        if per_class:
            click.echo("\n".join(result.per_class_table()))
        if profile:
            from .gpu.profile import table

            if result.profile:
                click.echo("\n".join(table(result.profile)))
            elif result.backend == "cpu":
                click.echo("(no GPU profile: the CPU backend ran)")
            else:
                click.echo("(no profile: kernels are profiled on one GPU at a time; use --device N)")
            if result.recomputed is not None:
                click.echo(f"certified: {result.n - result.recomputed} of {result.n} images in float16, "
                           f"{result.recomputed} recomputed exactly")
            if result.profile and streams > 1:
                click.echo(f"({streams} streams overlap: a kernel's time includes time shared with other streams' "
                           "kernels; --streams 1 gives exclusive times)")
    if predictions_path:
        predictions.write(predictions_path, result.predictions)
    if scores_path:
        predictions.write_array(scores_path, result.scores)
    if check:
        cpu = session.run(data, model, n, backend="cpu", progress=not quiet)
        same = int((cpu.predictions == result.predictions).sum())
        notice(f"check: {same} of {result.n} predictions equal the NumPy reference's "
               f"({cpu.correct} correct there)")
        if same < reference.MIN_AGREEMENT * result.n:
            raise Failure(f"only {same} of {result.n} predictions equal the NumPy reference's")
    if expect_accuracy is not None and abs(result.accuracy - expect_accuracy) > tolerance:
        raise Failure(f"accuracy {result.accuracy:g} differs from the expected {expect_accuracy:g} "
                               f"by {abs(result.accuracy - expect_accuracy):.6g}, more than the tolerance {tolerance:g}")


@cli.command("plan")
@click.argument("args", nargs=-1, metavar="[DATA]... [MODEL] [N]")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="auto: CUDA when usable here, else the CPU.")
@click.option("--chunk", type=click.IntRange(1), help="Images per chunk (default: the backend's).")
@click.option("--readers", type=click.IntRange(1, 256), help="Threads reading the data files.")
@cuda_options
@click.option("--decode", type=click.Choice(DECODE_MODES), default="auto", show_default=True,
              help="As run's --decode.")
@click.option("--scores", "with_scores", is_flag=True, help="Plan a run that also writes the class scores.")
@click.option("--gpu", "described", type=click.Choice(DESCRIBED_GPUS),
              help="Plan for this GPU, described (its memory, less a context's, free), instead of the machine's.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object (as run --json's \"plan\").")
def plan_command(args, backend, chunk, readers, streams, tile_width, gemm_algo, conv_algo, precision, device_ordinal,
                 devices, fast_math, decode, with_scores, described, as_json):
    """Print every choice `run` would make for these arguments, and why: the backend, device,
    algorithm, precision, the type images travel in, where chunks are decoded, the chunk, streams,
    resident or streamed. Nothing is compiled or computed: the files' metadata and first images
    are read, and (without --gpu) the backend starts to describe its device."""
    from . import session

    data, model, n = resolve(args)
    options = dict(chunk=chunk, readers=readers, streams=streams, tile_width=tile_width and int(tile_width),
                   gemm_algo=gemm_algo, conv_algo=conv_algo, precision=precision, devices=devices or [device_ordinal],
                   fast_math=fast_math, decode=decode)
    if described:
        from .gpu.device import KNOWN

        run_plan = session.plan_for(KNOWN[described], data, model, n, with_scores, **options)
    else:
        with session.Session(model, backend, notice=notice, **options) as s:
            run_plan = s.plan(data, n, scores=with_scores)
    if as_json:
        click.echo(json.dumps(run_plan.as_dict()))
        return
    click.echo(f"{run_plan.n:,} images ({' x '.join(map(str, run_plan.image_shape))}) of {', '.join(data)}, "
               f"model {model}:")
    for name, value, why in run_plan.rows():
        click.echo(f"  {name:<10} {value:<32}  {why}".rstrip())


@cli.command()
@click.argument("args", nargs=-1, metavar="[DATA] [MODEL] [N]")
@click.option("--random", "random_geometry", metavar="HxWxC,K1:C1,K2:C2,HIDDEN",
              help="Instead of DATA and MODEL: N (default 10000) random images and He-initialized weights of this "
                   "geometry, e.g. 32x32x3,5:32,5:64,256 (5x5 convs 3->32->64, fc 256 hidden, 10 classes).")
@click.option("--streams", type=click.IntRange(1, 64), default=STREAMS, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=20, show_default=True)
@click.option("--torch-compile/--no-torch-compile", default=True, show_default=True,
              help="Also time torch.compile (inductor) replayed as a CUDA graph (compiling takes a while).")
@click.option("--stream", "streamed", is_flag=True, help="Instead: stream the whole of DATA and compare the rate "
              "with the raw parallel read of its bytes and with the GPU on resident images.")
@click.option("--readers", type=click.IntRange(1, 256), help="--stream: reader threads (default: one per core, at most 16).")
@click.option("--devices", callback=parse_devices, metavar="LIST|all", help="--stream: GPUs to split the images over.")
@click.option("--serve", "served", is_flag=True, help="Instead: wrk against `cnninfer serve` on 127.0.0.1 (and "
              "the same with --max-batch 1, and a plain Starlette + PyTorch endpoint where torch sees a GPU): "
              "requests/s, p50/p99 for single uint8 images at each --clients, and for 4096-image uint8 requests.")
@click.option("--clients", default="1,16,64,256", show_default=True, help="--serve: concurrent connections.")
@click.option("--seconds", type=click.FloatRange(1, 600), default=5.0, show_default=True,
              help="--serve: seconds per measurement.")
@click.option("--soak", type=click.FloatRange(10, 36000), metavar="SECONDS",
              help="--serve: instead hold about half the peak rate this long; errors, answers and RSS.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="--serve: the server's backend. Without --serve, cpu compares cnninfer's CPU path with "
                   "onnxruntime and the NumPy reference (use --repeats 5: a round takes seconds).")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="--serve: also time the server with this many worker processes (--soak: soak that one).")
@click.option("--max-batch", type=click.IntRange(2), help="--serve: the batching servers' --max-batch.")
@click.option("--cold", is_flag=True, help="--backend cpu: whole processes instead, `cnninfer run` against a plain "
              "onnxruntime script (wall time, alternated).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON object.")
def bench(args, random_geometry, streams, warmup, repeats, torch_compile, streamed, readers, devices, served, clients,
          seconds, soak, backend, workers, max_batch, cold, as_json):
    """Validate every GPU algorithm against the NumPy reference, then time each (and PyTorch FP32,
    eager and compiled, when importable) on the first N images of DATA: GPU time and end to end.
    With --stream, the streamed run's images/s beside its two ceilings; with --serve, the HTTP
    server under load."""
    from .gpu import create as create_cuda

    if cold and (backend != "cpu" or served):
        raise InputError("bench --cold goes with --backend cpu (and no --serve)")
    if backend == "cpu" and not served:
        from .bench import cpu as bench_cpu

        if streamed:
            raise InputError("bench --backend cpu takes DATA, MODEL and N, or --random and N (no --stream)")
        if cold:
            paths, model, n = resolve(args)
            if n is not None or random_geometry:
                raise InputError("bench --cold runs whole files: DATA and MODEL only")
            result = bench_cpu.cold_bench(paths[0], model, repeats=repeats)
            click.echo(json.dumps(result) if as_json else "\n".join(bench_cpu.cold_table(result)))
            return
        if random_geometry:
            if len(args) > 1 or (args and not args[0].isdigit()):
                raise InputError("bench --random takes only N (no DATA or MODEL)")
            path, model, n = None, None, int(args[0]) if args else None
        else:
            paths, model, n = resolve(args)
            path = paths[0]
        result = bench_cpu.cpu_bench(path, model, n, warmup=min(warmup, 1), repeats=repeats, random=random_geometry)
        click.echo(json.dumps(result) if as_json else "\n".join(bench_cpu.table(result)))
        return
    if served:
        from .bench import serve as bench_serve
        from .serve import server

        server.require()
        paths, model, _ = resolve(args)
        try:
            counts = tuple(int(c) for c in clients.split(","))
        except ValueError:
            raise InputError(f"--clients: {clients!r} is not a comma-separated list of numbers") from None
        if soak:
            result = bench_serve.soak(paths[0], model, backend, seconds=soak, workers=workers, max_batch=max_batch)
        else:
            result = bench_serve.serve_bench(paths[0], model, backend, counts, seconds, workers=workers,
                                             max_batch=max_batch)
        click.echo(json.dumps(result) if as_json else "\n".join(bench_serve.table(result)))
        return

    if random_geometry:
        if len(args) > 1 or (args and not args[0].isdigit()) or streamed:
            raise InputError("bench --random takes only N (no DATA, MODEL or --stream)")
        from .bench.gpu import parse_geometry

        parse_geometry(random_geometry)
        data, model, n = None, None, int(args[0]) if args else None
    else:
        paths, model, n = resolve(args)
        if len(paths) > 1:
            raise InputError("bench takes one DATA file")
        data = paths[0]
    if streamed:
        from .bench import stream as benchmark

        result = benchmark.stream_bench(data, model, readers=readers, devices=devices)
    else:
        from .bench import gpu as benchmark

        create_cuda(chunk=None).close()  # one clear line when there is no usable GPU
        result = benchmark.bench(data, model, n, streams=streams, warmup=warmup, repeats=repeats,
                                 random=random_geometry, torch_compile=torch_compile)
    click.echo(json.dumps(result) if as_json else "\n".join(benchmark.table(result)))


@cli.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="auto: CUDA when usable here, else the CPU.")
@click.option("--chunk", type=click.IntRange(1), help="Images per chunk (default: the backend's).")
@cuda_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: a free one).")
@click.option("--max-batch", type=click.IntRange(1),
              help="Images merged into one forward pass at most (1: no batching). Default: 4096 on a GPU "
                   "(passes are padded to the next power of two, each size's buffers made at start), "
                   "256 on the CPU.")
@click.option("--max-delay-ms", type=click.FloatRange(0, 10_000), default=2.0, show_default=True,
              help="How long a batch waits for more requests after its first one arrived.")
@click.option("--token", envvar="CNNINFER_SERVE_TOKEN", help="Require 'Authorization: Bearer TOKEN' on /v1/* "
              "and /metrics (or set CNNINFER_SERVE_TOKEN).")
@click.option("--max-body-mb", type=click.FloatRange(0, min_open=True), default=64, show_default=True,
              help="Larger request bodies are refused (413).")
@click.option("--workers", default="auto", show_default=True, callback=lambda ctx, p, v: parse_workers(v),
              help="HTTP front ends: 1, one process with its own session; N > 1, N front-end processes "
                   "sharing the port that hand their requests to one engine process (one session, so one "
                   "CUDA context, batching every front end's requests together); auto: 1 on the CPU "
                   "backend, else three quarters of the cores, 2 to 12. One front end handles ~3,000-4,000 "
                   "requests/s.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=8001, show_default=True,
              help="Port of the KServe v2 gRPC service on --host (0: a free one); its address is printed "
                   "under the HTTP one.")
@click.option("--no-grpc", is_flag=True, help="Serve no gRPC (HTTP only).")
@click.option("--model-sha256", metavar="HEX", help="Refuse to start unless the model file's sha256 is HEX "
              "(pins what is served; /v1/model reports it).")
@click.option("--max-connections", type=click.IntRange(1), default=2048, show_default=True,
              help="Connections open at once; more are closed as they are accepted.")
@click.option("--header-timeout-s", type=click.FloatRange(0, min_open=True), default=10, show_default=True,
              help="A connection that has not sent a request's headers within this is closed.")
@click.option("--body-timeout-s", type=click.FloatRange(0, min_open=True), default=10, show_default=True,
              help="A body that sends nothing for this long is answered 408.")
@click.option("--max-buffered-mb", type=click.FloatRange(0, min_open=True), default=512, show_default=True,
              help="Request bodies held at once, all HTTP connections and front ends together (past it 503); "
                   "each front end's gRPC messages being read or held get as many bytes of their own (reads wait "
                   "their turn).")
@click.option("--max-pixels", type=click.IntRange(1), default=16 << 20, show_default=True,
              help="A PNG or JPEG with more pixels (read from its header) is refused (413) undecoded.")
@click.option("--decoders", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Bodies decoded at once, on threads of their own (never on the event loop).")
@click.option("--request-timeout-s", type=click.FloatRange(0, min_open=True), default=30, show_default=True,
              help="A request not answered this long after its images were queued gets 504.")
@click.option("--drain-s", type=click.FloatRange(0, 600), default=5, show_default=True,
              help="On SIGTERM or Ctrl-C: in-flight requests answered within this; the rest get 503.")
def serve(model, backend, chunk, streams, tile_width, gemm_algo, conv_algo, precision, device_ordinal, devices,
          fast_math, host, port, max_batch, max_delay_ms, token, max_body_mb, workers, model_sha256,
          max_connections, header_timeout_s, body_timeout_s, max_buffered_mb, max_pixels, decoders,
          request_timeout_s, drain_s, grpc_port, no_grpc):
    """Serve MODEL (default: the bundled one) over HTTP with dynamic batching, until SIGTERM or
    Ctrl-C (in-flight requests are answered first). Prints one line with the URL once it accepts
    connections. POST /v1/predict takes an .npy array of (N, H, W, C) images or one PNG / JPEG;
    / is a page to draw a digit on. Needs: pip install 'cnninfer[serve]'."""
    from . import env
    from .data import loader
    from .serve import server
    from .options import Options

    server.require()
    settings = server.Settings(max_batch=max_batch or server.auto_max_batch(backend), max_delay_ms=max_delay_ms, token=token or None,
                               max_body_bytes=int(max_body_mb * 2**20), max_buffered_bytes=int(max_buffered_mb * 2**20),
                               max_pixels=max_pixels, decoders=decoders, max_connections=max_connections,
                               header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
                               request_timeout_s=request_timeout_s, drain_s=drain_s,
                               grpc=None if no_grpc or not server.grpc_available() else f"{host}:{grpc_port}")
    options = dict(chunk=chunk, streams=streams, tile_width=tile_width and int(tile_width), gemm_algo=gemm_algo,
                   conv_algo=conv_algo, precision=precision, devices=devices or [device_ordinal], fast_math=fast_math)
    Options.of(**options)  # bad options, variables and model files: one line before any worker starts
    env.check()
    path = model or defaults.model()
    digest = loader.sha256(path)
    if model_sha256 is not None and model_sha256.strip().lower() != digest:
        raise InputError(f"{path}: its sha256 is {digest}, not {model_sha256.strip()} (--model-sha256)")
    spec = server.Spec(loader.load_model(path), backend, options, digest)
    if workers == "auto":
        workers = server.auto_workers(backend)
    server.serve(spec, settings, host, port, workers,
                 announce=lambda line: click.echo(line))


@cli.command("export-onnx")
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
def export_onnx(model, out):
    """Write MODEL as an ONNX graph to OUT (whole): input x (N, H, W, C) float32 NHWC, outputs scores
    (N, classes) and labels (N,) int64. H and W are fixed to the square size fc1 implies (28 for
    MNIST); the batch is free. onnxruntime (or any ONNX runtime) then runs the network without
    cnninfer: other languages, other runtimes. Needs: pip install 'cnninfer[onnx]'."""
    from . import network, onnx_export
    from .data import loader, predictions

    predictions.check_path(out, formats=(".onnx",))
    m = loader.load_model(model)
    try:
        shape = network.image_shape(m)
    except InputError:
        shape = None  # no square size fits: H and W stay free
    onnx_export.export(m, out, shape)
    where = "x (N, {}, {}, {})".format(*shape) if shape else "x (N, H, W, C)"
    click.echo(f"wrote {out}: {where} float32 NHWC -> scores (N, {m.fc2.shape[1]}), labels (N,)", err=True)


@cli.command("convert-mnist")
@click.argument("images", type=click.Path(dir_okay=False))
@click.argument("labels", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--limit", type=int, help="Convert only the first N images.")
@click.option("--compress", is_flag=True, help="Write gzip-compressed, chunked datasets.")
def convert_mnist(images, labels, out, limit, compress):
    """Convert MNIST IDX files (gzip or raw) to cnninfer's HDF5 data format: x = pixels * float32(1/255),
    NHWC (N, 28, 28, 1); y one-hot float64 (N, 10). OUT is written whole."""
    from .data import mnist

    n = mnist.convert(images, labels, out, limit=limit, compress=compress)
    click.echo(f"wrote {n} images to {out}", err=True)


@cli.command()
def info():
    """The GPU, its compute capability and memory, the CUDA driver and toolkit, PyCUDA, the kernel
    cache, and which backends are usable here."""
    import platform
    import subprocess

    import h5py
    import numpy

    from . import gpu
    from .gpu import compiler

    click.echo(f"cnninfer {__version__}; Python {platform.python_version()}, NumPy {numpy.__version__}, h5py {h5py.__version__}")
    try:
        nvcc = compiler.nvcc()
        release = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        click.echo(f"CUDA toolkit: {nvcc} ({release})")
    except Exception as e:  # info reports what it can, never fails on a missing piece
        click.echo(f"CUDA toolkit: not usable ({getattr(e, 'message', e)})")
    click.echo(f"kernel cache: {compiler.cache_dir()}")
    shipped = compiler.prebuilt_arches()
    click.echo(f"prebuilt kernels: {', '.join(shipped)}" if shipped else
               "prebuilt kernels: none (an editable install, or a wheel built without nvcc: kernels compile on first use)")
    from .cpu import net

    click.echo(f"CPU backend: {net.net_status()}")
    try:
        import pycuda
        import pycuda.driver as cuda

        click.echo(f"PyCUDA: {pycuda.VERSION_TEXT}")
        cuda.init()
        v = cuda.get_driver_version()
        click.echo(f"CUDA driver: {v // 1000}.{v % 1000 // 10}")
        for i in range(cuda.Device.count()):
            d = cuda.Device(i)
            major, minor = d.compute_capability()
            click.echo(f"GPU {i}: {d.name()}, compute capability {major}.{minor}, "
                       f"{d.total_memory() / 2**30:.1f} GiB, {d.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)} SMs")
    except Exception as e:
        click.echo(f"PyCUDA / CUDA driver: not usable ({e})")
    try:
        gpu.create(chunk=None).close()
        usable = "cpu, cuda"
    except Exception as e:
        usable = f"cpu (cuda: {getattr(e, 'message', e)})"
    click.echo(f"backends usable here: {usable}")


def main():
    cli(prog_name="cnninfer")
