"""Fuzzing the loader and the CLI with malformed data and model files (hypothesis): every one
ends with exit code 2 and one line on stderr, never a traceback, never an output file."""
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import invoke, small_data, small_model, write

RANKS = {"x": 4, "y": 2, "conv1": 4, "conv2": 4, "fc1": 2, "fc2": 2}
FUZZ = settings(max_examples=int(os.environ.get("CNNINFER_FUZZ_EXAMPLES", 300)), deadline=None, derandomize=not os.environ.get("CNNINFER_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def bad_dtype(draw, value):
    kind = draw(st.sampled_from(["string", "vlen", "compound", "complex", "bool", "array"]))
    shape = value.shape
    if kind == "string":
        return np.full(shape, b"7", dtype="S3")
    if kind == "vlen":
        return lambda f, n: f.create_dataset(n, shape=shape[:1], dtype=h5py.string_dtype())
    if kind == "compound":
        return np.zeros(shape[:1], dtype=[("a", "f4"), ("b", "i2")])
    if kind == "complex":
        return value.astype(np.complex64)
    if kind == "bool":
        return value > 0
    return lambda f, n: f.create_dataset(n, shape=shape[:1], dtype=np.dtype(("f4", (3,))))


@st.composite
def mutation(draw, files):
    """One way to break one dataset of `files` ({name: value}); returns the broken mapping."""
    name = draw(st.sampled_from(sorted(files)))
    value = files[name]
    kind = draw(st.sampled_from(["rank", "shape", "dtype", "nonfinite", "empty", "null", "scalar", "group",
                                 "missing", "dangling", "external", "huge"]))
    out = dict(files)
    if kind == "rank":
        rank = draw(st.integers(1, 6).filter(lambda r: r != RANKS[name]))
        out[name] = np.ones(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)), np.float32)
    elif kind == "shape":
        shape = list(value.shape)
        # Every axis of a weight is pinned by another; of x, only channels are (pooling floors odd
        # sizes, so one more row can still fit), and of y, only the classes.
        axis = {"x": 3, "y": 1}.get(name) or draw(st.integers(0, len(shape) - 1))
        shape[axis] += draw(st.integers(1, 9))
        out[name] = np.ones(shape, np.float32)
    elif kind == "dtype":
        out[name] = bad_dtype(draw, value)
    elif kind == "nonfinite":
        broken = value.astype(np.float64)
        idx = tuple(draw(st.integers(0, d - 1)) for d in broken.shape)
        beyond_float32 = [] if name == "y" else [1e39, -3e300]  # y is checked as the float64 it is
        broken[idx] = draw(st.sampled_from([np.nan, np.inf, -np.inf] + beyond_float32))
        out[name] = broken
    elif kind == "empty":
        shape = list(value.shape)
        shape[draw(st.integers(0, len(shape) - 1))] = 0
        out[name] = np.zeros(shape, np.float32)
    elif kind == "null":
        out[name] = lambda f, n: f.create_dataset(n, data=h5py.Empty("f4"))
    elif kind == "scalar":
        out[name] = np.float32(draw(st.floats(-10, 10)))
    elif kind == "group":
        out[name] = lambda f, n: f.create_group(n)
    elif kind == "missing":
        out[name] = None
    elif kind == "dangling":
        out[name] = lambda f, n: f.__setitem__(n, h5py.SoftLink("/not/there"))
    elif kind == "external":
        out[name] = lambda f, n: f.__setitem__(n, h5py.ExternalLink("elsewhere.h5", n))
    else:
        shape = (2**40,) + value.shape[1:] if name == "x" else tuple(2**20 for _ in value.shape)
        out[name] = lambda f, n: f.create_dataset(n, shape=shape, dtype="f4", chunks=(1,) * len(shape))
    return out


def assert_clean_refusal(r, out):
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzzed_data_files(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    files = data.draw(mutation(small_data(rng, n=data.draw(st.integers(1, 9)))))
    out = tmp / "p.npy"
    r = invoke("run", write(tmp / "data.h5", files), write(tmp / "model.h5", small_model(rng)),
               "--backend", "cpu", "--predictions", out)
    assert_clean_refusal(r, out)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_fuzzed_model_files(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    files = data.draw(mutation(small_model(rng)))
    out = tmp / "p.csv"
    r = invoke("run", write(tmp / "data.h5", small_data(rng)), write(tmp / "model.h5", files),
               "--backend", "cpu", "--predictions", out)
    assert_clean_refusal(r, out)


@pytest.mark.slow
@FUZZ
@given(data=st.data(), which=st.sampled_from(["data", "model"]))
def test_fuzzed_bytes(tmp_path_factory, data, which):
    """Truncated files, garbage bytes, corrupted headers: refused cleanly; a corruption that
    leaves a readable, valid file may run, but never with a traceback."""
    tmp = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    good = {"data": write(tmp / "data.h5", small_data(rng, 40)), "model": write(tmp / "model.h5", small_model(rng))}
    raw = bytearray(good[which].read_bytes())
    how = data.draw(st.sampled_from(["truncate", "garbage", "flip", "signature+garbage"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "garbage":
        raw = bytearray(data.draw(st.binary(min_size=0, max_size=4096)))
    elif how == "signature+garbage":
        raw = raw[:8] + bytearray(data.draw(st.binary(min_size=0, max_size=4096)))
    else:
        for _ in range(data.draw(st.integers(1, 16))):
            raw[data.draw(st.integers(0, min(len(raw), 4096) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    good[which].write_bytes(bytes(raw))
    out = tmp / "p.npy"
    r = invoke("run", good["data"], good["model"], "--backend", "cpu", "--predictions", out)
    if how == "flip" and r.exit_code == 0:
        assert out.exists()
        return
    assert_clean_refusal(r, out)
