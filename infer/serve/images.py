"""Request bodies to images, checked as the command line checks files: an .npy array of (N, H, W, C)
images of any integer or float type, or one PNG / JPEG picture brought to the model's (H, W, C)
the way MNIST's digits were made. Every problem is an InputError with one line about the body
(no server paths, no Python reprs); a picture past the pixel limit is TooManyPixels (HTTP 413),
refused from its header, before it is decoded."""
import io
import math

import numpy as np

from .. import network
from ..errors import InputError
from ..data.reader import check_finite

NPY = "application/x-npy"
PICTURES = {"image/png": "PNG", "image/jpeg": "JPEG"}  # media type -> the one decoder Pillow may use
CONTENT_TYPES = (NPY, *PICTURES)
LABEL = "body"
MAX_PIXELS = 16 << 20  # serve --max-pixels' default: a 16-megapixel photo (4096 x 4096)
WORK_SIDE = 1024  # larger pictures are shrunk to about this side first (JPEG as it decodes): memory


class TooManyPixels(InputError):
    """A picture whose header gives more pixels than the limit (HTTP 413)."""


def media_type(header):
    """'application/x-npy; charset=...' -> 'application/x-npy'."""
    return (header or "").split(";")[0].strip().lower()


HEADERS = {}  # an .npy header's bytes -> npy_header's answer: clients send the same few again and again
KEPT_HEADERS = 256


def npy_header(body):
    """(shape, Fortran order, dtype, offset of the data) of an .npy body, or InputError."""
    if not body.startswith(b"\x93NUMPY"):
        raise InputError(f"{LABEL}: not an .npy array (it does not start with .npy's magic string)")
    wide = body[6:7] != b"\x01"  # versions 2 and 3: a 4-byte header length
    end = 12 + int.from_bytes(body[8:12], "little") if wide else 10 + int.from_bytes(body[8:10], "little")
    key = body[:end] if end <= 4096 else None
    known = HEADERS.get(key)
    if known is None:
        known = _npy_header(body)
        if key is not None and known[3] == end:
            if len(HEADERS) >= KEPT_HEADERS:
                HEADERS.clear()
            HEADERS[key] = known
    return known


def _npy_header(body):
    f = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError
        shape, fortran, dtype = read(f, max_header_size=10_000)
    except Exception:  # NumPy raises ValueError, OSError, EOFError... on a header it cannot read
        raise InputError(f"{LABEL}: not an .npy array (its header cannot be read)") from None
    return shape, fortran, dtype, f.tell()


def from_npy(body, model):
    """The images of an .npy body, shapes checked against the model and values checked finite
    (integer arrays as they are: they travel in their own type). The body holds the array and
    nothing else."""
    shape, fortran, dtype, offset = npy_header(body)
    if dtype.kind not in "iuf" or dtype.subdtype is not None or dtype.hasobject:
        raise InputError(f"{LABEL}: type {dtype} is not a number type (integer or float)")
    if len(shape) != 4:
        raise InputError(f"{LABEL}: shape {shape}, expected (N, H, W, C) images")
    expected = math.prod(shape) * dtype.itemsize
    if len(body) - offset != expected:
        how = "more" if len(body) - offset > expected else "fewer"
        raise InputError(f"{LABEL}: {len(body) - offset} bytes of data where the header's {dtype} array of "
                         f"shape {shape} has {expected} ({how} bytes than the array)")
    network.geometry(model, (max(shape[0], 1),) + shape[1:], LABEL, None)
    x = np.frombuffer(body, dtype, math.prod(shape), offset)
    x = x.reshape(shape[::-1]).transpose() if fortran else x.reshape(shape)
    return checked(x, LABEL)


def checked(x, label):
    """x, once its float values are all finite float32 numbers (InputError naming the first that is
    not); integer arrays as they are."""
    if x.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            as32 = x.astype(np.float32, copy=False)
        check_finite(as32, x, label, 0)
    return x


def from_picture(body, model, kind="image/png", max_pixels=MAX_PIXELS):
    """One picture as MNIST made its digits: grayscale, a dark digit on light paper inverted to
    white on black, cropped to the digit, its longer side scaled to 20/28 of the model's, placed
    by its centre of mass in the middle, values in [0, 1]: float32 (1, H, W, C). A picture of the
    model's size with a dark border is taken as it is (an MNIST digit saved as PNG gives the
    array's answer). Only the decoder of `kind` reads it (its bytes must be that format); its
    size is checked from its header before decoding; EXIF orientation is applied."""
    try:
        from PIL import Image, ImageOps, UnidentifiedImageError
    except ImportError:
        raise InputError(f"{LABEL}: reading PNG or JPEG needs Pillow: pip install 'cnninfer[serve]'") from None
    fmt = PICTURES[kind]
    try:
        picture = Image.open(io.BytesIO(body), formats=[fmt])
    except Image.DecompressionBombError:  # Pillow's own limit, past twice Image.MAX_IMAGE_PIXELS
        raise TooManyPixels(f"{LABEL}: a picture of more pixels than the server's limit of {max_pixels}") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise InputError(f"{LABEL}: not a readable {fmt} picture (its Content-Type is {kind})") from None
    pixels = picture.size[0] * picture.size[1]
    if pixels > max_pixels:
        raise TooManyPixels(f"{LABEL}: a picture of {picture.size[0]}x{picture.size[1]} = {pixels} pixels, "
                            f"more than the server's limit of {max_pixels}")
    try:
        if fmt == "JPEG":  # decoded at 1/2, 1/4 or 1/8 scale where that stays above WORK_SIDE
            picture.draft("L", (WORK_SIDE, WORK_SIDE))
        picture.load()
        picture = ImageOps.exif_transpose(picture)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError):
        raise InputError(f"{LABEL}: not a whole {fmt} picture (its data cannot be decoded)") from None
    side = max(picture.size)
    if side > 2 * WORK_SIDE:  # a box filter down to about WORK_SIDE: the digit is later 20 pixels high
        picture = picture.reduce(side // WORK_SIDE)
    if picture.mode in ("RGBA", "LA", "PA") or "transparency" in picture.info:
        # Transparent pixels are paper: flatten onto white
        rgba = picture.convert("RGBA")
        paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        picture = Image.alpha_composite(paper, rgba)
    h, w, c = network.image_shape(model)
    # As the data files were made: uint8 * float32(1/255), in float32 (bit-exact with them)
    gray = np.asarray(picture.convert("L"), np.uint8) * np.float32(1 / 255)
    if gray.shape == (h, w) and np.median(_border(gray)) <= 0.5:
        return np.repeat(gray[:, :, None], c, axis=2)[None]  # already an MNIST-style digit: as it is
    return mnist_style(gray, h, w, c)[None]


def _border(gray):
    return np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])


def mnist_style(gray, h, w, c):
    """A grayscale picture (values in [0, 1]) to (h, w, c) float32, MNIST's way (see from_picture)."""
    from PIL import Image

    if np.median(_border(gray)) > 0.5:  # light paper, dark ink
        gray = 1 - gray
    # The paper's shade to 0 and the strongest ink to 1
    paper = np.median(_border(gray))
    span = gray.max() - paper
    gray = np.clip((gray - paper) / span, 0, 1) if span > 0 else np.zeros_like(gray)
    ink = gray > 0.1
    out = np.zeros((h, w), np.float32)
    if ink.any():
        rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
        digit = gray[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
        box = max(1, round(20 * min(h, w) / 28))
        scale = box / max(digit.shape)
        size = (max(1, round(digit.shape[1] * scale)), max(1, round(digit.shape[0] * scale)))
        digit = np.asarray(Image.fromarray(digit, "F").resize(size, Image.LANCZOS), np.float32).clip(0, 1)
        total = digit.sum()
        if total > 0:  # its centre of mass to the middle, kept inside the frame
            cy = (digit.sum(1) * np.arange(digit.shape[0])).sum() / total
            cx = (digit.sum(0) * np.arange(digit.shape[1])).sum() / total
        else:
            cy, cx = (digit.shape[0] - 1) / 2, (digit.shape[1] - 1) / 2
        top = int(np.clip(round(h / 2 - cy), 0, h - digit.shape[0]))
        left = int(np.clip(round(w / 2 - cx), 0, w - digit.shape[1]))
        out[top:top + digit.shape[0], left:left + digit.shape[1]] = digit[:h - top, :w - left]
    return np.repeat(out[:, :, None], c, axis=2)


def readable(content_type):
    """The media type of a Content-Type header this module reads; UnsupportedType otherwise."""
    kind = media_type(content_type)
    if kind not in CONTENT_TYPES:
        raise UnsupportedType(f"{LABEL}: Content-Type {kind or '(none)'!r} is not one of {', '.join(CONTENT_TYPES)}")
    return kind


def decode(content_type, body, model, max_pixels=MAX_PIXELS):
    """The images of a request body by its Content-Type (see readable)."""
    kind = readable(content_type)
    return from_npy(body, model) if kind == NPY else from_picture(body, model, kind, max_pixels)


class UnsupportedType(InputError):
    """A body of a type the server does not read (HTTP 415)."""
