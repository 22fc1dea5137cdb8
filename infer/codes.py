"""float32 images that are 8-bit pixels times float32(1/255), as MNIST's own conversion makes them
(infer/mnist.py, and the ECE408 files), travel to a GPU as their 8-bit codes: a quarter of the
bytes read into page-locked memory and uploaded, the same float32 values rebuilt on the GPU
(code * float32(1/255), one rounding, as NumPy's uint8 * np.float32(1/255)), so the same bits
downstream. A data set is taken to hold codes when its first image does (DataSet.fits_codes);
every value is checked again as it is packed (read_pool.c's pack_codes, or `pack` here), and a
value that is not a code fails the read with NotCodes, after which the run reads float32."""
import numpy as np

SCALE = np.float32(1 / 255)
# The wire type of codes: one byte an element, unlike any stored type (so no buffer, converter or
# prepared run of uint8 images is taken for one of codes, or the other way round); np.dtype(CODES.str)
# is CODES again, as prepared runs keep it
CODES = np.dtype("V1")


class NotCodes(Exception):
    """A float32 value read as an 8-bit code is not one: the run reads float32 instead."""


def pack(values, out=None):
    """The codes of float32 `values` (into out, of CODES or uint8, where given), or None where one
    value is not exactly code * SCALE in float32 (-0.0, NaN and values past 255 * SCALE are not)."""
    values = np.asarray(values)
    if values.dtype != np.float32:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(values * np.float32(255))
        fits = (k >= 0) & (k <= 255)
        k = np.where(fits, k, 0).astype(np.uint8)
    back = k * SCALE
    if not (fits.all() and np.array_equal(back.view(np.uint32), values.view(np.uint32))):
        return None
    if out is None:
        return k
    out.view(np.uint8)[...] = k
    return out


def unpack(codes):
    """float32 images from their codes, as the GPU rebuilds them."""
    return np.asarray(codes).view(np.uint8) * SCALE
