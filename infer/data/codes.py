"""float32 images that are 8-bit pixels travel to a GPU as their 8-bit codes: a quarter of the
bytes read into page-locked memory and uploaded. convert_kernel2 rebuilds the same float32 values
(the same bits downstream); the fused kernels compute conv1 from the codes themselves (float32's
accuracy, not its bits: cuda/fused_conv1_wgmma.cuh). Three scalings are recognized, each at most
one float32 rounding:
- MUL, code * float32(1/255): NumPy's uint8 * np.float32(1/255), as MNIST's own conversion
  (infer/data/mnist.py) and the ECE408 files make them;
- DIV, code / 255 in float32 (or in float64, then rounded to float32: the same values): torchvision's
  ToTensor, Keras's x.astype("float32") / 255;
- ONE, the code itself (pixels stored as float32 unscaled).
MUL and DIV give different float32 values for 126 of the 256 codes. A data set is taken to hold codes
of a scaling when its first images do (DataSet.codes_wire); every value is checked again as it is
packed (read_pool/codes.c's pack paths, or `pack` here), and a value that is not a code fails the read
with NotCodes, after which the run reads float32."""
import numpy as np

SCALE = np.float32(1 / 255)
# The wire types of codes, one byte an element, unlike any stored image type (so no buffer,
# converter or prepared run of uint8 images is taken for one of codes, or the other way round);
# np.dtype(wire.str) is the same wire again, as prepared runs keep it
MUL = np.dtype("V1")
DIV = np.dtype("S1")
ONE = np.dtype("b1")
WIRES = (MUL, DIV, ONE)  # in the order a data set that fits several takes them
SCALINGS = {MUL: 0, DIV: 1, ONE: 2}  # read_pool/codes.c's and convert_kernel2's numbers
NAMES = {MUL: "8-bit codes (x * float32(1/255))", DIV: "8-bit codes (x / 255)", ONE: "8-bit codes (x unscaled)"}


def staged_scaling(wire):
    """The scaling number a kernel that reads images of byte wire type `wire` as uploaded is given
    (the fused kernels: conv1 from the codes, scaled by the scaling's c0): a codes wire's SCALINGS,
    uint8's ONE (its astype); None for any other wire."""
    wire = np.dtype(wire)
    return SCALINGS[wire] if wire in SCALINGS else SCALINGS[ONE] if wire == np.uint8 else None


class NotCodes(Exception):
    """A float32 value read as an 8-bit code is not one: the run reads float32 instead."""


def unpack(k, wire):
    """The float32 values of codes k (uint8) in the scaling of `wire`, as the GPU rebuilds them."""
    k = np.asarray(k).view(np.uint8)
    if wire == MUL:
        return k * SCALE
    return k.astype(np.float32) / np.float32(255) if wire == DIV else k.astype(np.float32)


def pack(values, wire, out=None):
    """The codes (uint8; into out, of a codes wire or uint8, where given) of float32 `values` in the
    scaling of `wire`, or None where one value is not exactly a code's (-0.0, NaN and values past
    255's are not)."""
    values = np.asarray(values)
    if values.dtype != np.float32:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(values if wire == ONE else values * np.float32(255))
        fits = (k >= 0) & (k <= 255)
        k = np.where(fits, k, 0).astype(np.uint8)
    if not (fits.all() and np.array_equal(unpack(k, wire).view(np.uint32), values.view(np.uint32))):
        return None
    if out is None:
        return k
    out.view(np.uint8)[...] = k
    return out


def packed(values):
    """(the first codes wire whose scaling gives every one of float32 `values`, their codes), or None."""
    for wire in WIRES:
        k = pack(values, wire)
        if k is not None:
            return wire, k
    return None


def wire_of(values):
    """The first codes wire whose scaling gives every one of float32 `values`, or None."""
    found = packed(values)
    return found and found[0]
