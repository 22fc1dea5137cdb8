"""The command line: thin click commands over the library (engine, loader, mnist, bench)."""
import json
import os

import click

from . import __version__, backends, engine, predictions
from .errors import AccuracyMismatch, InputError


def notice(line):
    click.echo(line, err=True)


@click.group(context_settings=dict(help_option_names=["-h", "--help"]))
@click.version_option(__version__, prog_name="cnninfer")
def cli():
    """cnninfer: inference of the ECE408 CNN on HDF5 data, on the GPU (PyCUDA) or the CPU (NumPy)."""


@cli.command()
@click.argument("data", type=click.Path(dir_okay=False))
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("n", type=int, required=False)
@click.option("--backend", type=click.Choice(backends.NAMES), default="auto", show_default=True,
              help="auto: CUDA when usable here, else the CPU.")
@click.option("--chunk", type=click.IntRange(1), help="Images per chunk (default: the backend's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the two lines.")
@click.option("--expect-accuracy", type=click.FloatRange(0, 1), metavar="A",
              help="Exit with code 1 when |accuracy - A| > the tolerance: a regression check for CI.")
@click.option("--tolerance", type=click.FloatRange(0), default=0.0, show_default=True, metavar="T")
@click.option("--predictions", "predictions_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the predicted labels to PATH (.npy or .csv), whole, after a successful run.")
def run(data, model, n, backend, chunk, as_json, expect_accuracy, tolerance, predictions_path):
    """Classify the first N images of DATA (all by default) with MODEL and print the correctness.

    DATA holds x (N, H, W, C) and one-hot y (N, classes); MODEL holds conv1, conv2, fc1, fc2.
    `elapsed` is the forward pass from images in host memory to labels in host memory.
    """
    if predictions_path:
        predictions.check_path(predictions_path)
    result = engine.run(data, model, n, backend=backend, notice=notice, chunk=chunk)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        click.echo("input dimensions = " + " x ".join(map(str, result.shape)))
        click.echo(f"Done with {result.n} queries in elapsed = {result.timing['forward']:.1f} milliseconds. "
                   f"Correctness: {result.accuracy:g}")
    if predictions_path:
        predictions.write(predictions_path, result.predictions)
    if expect_accuracy is not None and abs(result.accuracy - expect_accuracy) > tolerance:
        raise AccuracyMismatch(f"accuracy {result.accuracy:g} differs from the expected {expect_accuracy:g} "
                               f"by {abs(result.accuracy - expect_accuracy):.6g}, more than the tolerance {tolerance:g}")


def main():
    cli(prog_name="cnninfer")
