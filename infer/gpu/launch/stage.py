"""Images as uploaded to float32: integer types (Convert), 8-bit codes (ConvertCodes), and the check of float32
images for the pipelines whose kernels do not check them as they read them (Check)."""
from ...data import codes
from .base import Launcher, ceil_div


class Convert(Launcher):
    """Integer images (as uploaded) to float32 on the GPU, exactly as NumPy's astype."""
    source, kernel, arg_types = "stage", "convert_kernel1", "PPq"
    TYPES = {"u1": "unsigned char", "i1": "signed char", "u2": "unsigned short", "i2": "short",
             "u4": "unsigned int", "i4": "int", "u8": "unsigned long long", "i8": "long long"}

    def __init__(self, build, dtype):
        super().__init__(build, SRC_T=self.TYPES[dtype.kind + str(dtype.itemsize)])

    def __call__(self, stream, src, dst, n):
        self.launch(stream, (min(ceil_div(n, 256), 4096), 1), (256, 1, 1), src, dst, n)


class ConvertCodes(Launcher):
    """8-bit codes of float32 images (infer/data/codes.py) to the float32 values they stand for, in the
    scaling of the codes wire `wire`."""
    source, kernel, arg_types = "stage", "convert_kernel2", "PPqfi"

    def __init__(self, build, wire):
        super().__init__(build)
        self.scaling = codes.SCALINGS[wire]

    def __call__(self, stream, src, dst, n):
        self.launch(stream, (min(ceil_div(n, 256), 4096), 1), (256, 1, 1), src, dst, n, codes.SCALE, self.scaling)


def converter(build, wire):
    """The launcher turning images uploaded in type `wire` into float32."""
    return ConvertCodes(build, wire) if wire in codes.WIRES else Convert(build, wire)


class Check(Launcher):
    """*bad = min(*bad, first image holding a value that is not finite) over float32 images (for the
    pipelines whose kernels do not check the images as they read them)."""
    source, kernel, arg_types = "stage", "check_kernel2", "PiiP"

    def __call__(self, stream, x, n, per_image, bad):
        self.launch(stream, (min(ceil_div(n * per_image, 4 * 256), 4096), 1), (256, 1, 1), x, n, per_image, bad)
