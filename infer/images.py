"""Request bodies to images, checked as the command line checks files: an .npy array of (N, H, W, C)
images of any integer or float type, or one PNG / JPEG picture brought to the model's (H, W, C)
the way MNIST's digits were made. Every problem is an InputError with one line."""
import io

import numpy as np

from . import network
from .errors import InputError
from .reader import check_finite

NPY = "application/x-npy"
PICTURES = ("image/png", "image/jpeg")
CONTENT_TYPES = (NPY, *PICTURES)
LABEL = "body"


def media_type(header):
    """'application/x-npy; charset=...' -> 'application/x-npy'."""
    return (header or "").split(";")[0].strip().lower()


def from_npy(body, model):
    """The images of an .npy body, shapes checked against the model and values checked finite
    (integer arrays as they are: they travel in their own type)."""
    if not body.startswith(b"\x93NUMPY"):
        raise InputError(f"{LABEL}: not an .npy array (it does not start with .npy's magic string)")
    try:
        x = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # NumPy raises ValueError, OSError, EOFError... on what is not an .npy file
        raise InputError(f"{LABEL}: not an .npy array ({' '.join(str(e).split()) or type(e).__name__})") from None
    if not isinstance(x, np.ndarray):
        raise InputError(f"{LABEL}: not an .npy array")
    if x.dtype.kind not in "iuf" or x.dtype.subdtype is not None:
        raise InputError(f"{LABEL}: type {x.dtype} is not a number type (integer or float)")
    if x.ndim != 4:
        raise InputError(f"{LABEL}: shape {x.shape}, expected (N, H, W, C) images")
    network.geometry(model, (max(len(x), 1),) + x.shape[1:], LABEL)
    if x.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            as32 = x.astype(np.float32, copy=False)
        check_finite(as32, x, LABEL, 0)
    return x


def from_picture(body, model):
    """One picture as MNIST made its digits: grayscale, a dark digit on light paper inverted to
    white on black, cropped to the digit, its longer side scaled to 20/28 of the model's, placed
    by its centre of mass in the middle, values in [0, 1]: float32 (1, H, W, C). A picture of the
    model's size with a dark border is taken as it is (an MNIST digit saved as PNG gives the
    array's answer)."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError(f"{LABEL}: reading PNG or JPEG needs Pillow: pip install 'cnninfer[serve]'") from None
    try:
        picture = Image.open(io.BytesIO(body))
        picture.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise InputError(f"{LABEL}: not a PNG or JPEG picture ({' '.join(str(e).split())})") from None
    if picture.mode in ("RGBA", "LA", "PA") or "transparency" in picture.info:
        # Transparent pixels are paper: flatten onto white
        rgba = picture.convert("RGBA")
        paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        picture = Image.alpha_composite(paper, rgba)
    h, w, c = image_shape(model)
    # As the data files were made: uint8 * float32(1/255), in float32 (bit-exact with them)
    gray = np.asarray(picture.convert("L"), np.uint8) * np.float32(1 / 255)
    if gray.shape == (h, w) and np.median(_border(gray)) <= 0.5:
        return np.repeat(gray[:, :, None], c, axis=2)[None]  # already an MNIST-style digit: as it is
    return mnist_style(gray, h, w, c)[None]


def _border(gray):
    return np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])


def image_shape(model):
    """The (H, W, C) a model takes: C from conv1; H and W those of the model's training data,
    square, found from fc1's inputs (MNIST: 28)."""
    k1, _, c, _ = model.conv1.shape
    k2, _, _, c2 = model.conv2.shape
    for side in range(k1 + 2, 1025):
        p2 = ((side - k1 + 1) // 2 - k2 + 1) // 2
        if p2 >= 1 and p2 * p2 * c2 == model.fc1.shape[0]:
            return side, side, c
    raise InputError(f"{model.path}: no square image size fits its fc1 ({model.fc1.shape[0]} inputs)")


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


def decode(content_type, body, model):
    """The images of a request body by its Content-Type (see readable)."""
    kind = readable(content_type)
    return from_npy(body, model) if kind == NPY else from_picture(body, model)


class UnsupportedType(InputError):
    """A body of a type the server does not read (HTTP 415)."""
