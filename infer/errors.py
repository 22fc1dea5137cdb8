"""Errors the command line turns into one line on stderr and an exit code, never a traceback."""
import click


class InputError(click.ClickException, ValueError):
    """Bad input from the user (a file, a dataset, an option, an array): exit code 2 on the
    command line; a ValueError to Python callers."""

    exit_code = 2


class BackendUnavailable(InputError):
    """A backend that was asked for cannot run on this machine: exit code 2."""


class ScoresOverflow(InputError):
    """The scores of an image are not finite: float32 overflowed on weights or images that are
    finite but too large. Refused rather than reported as a silently wrong label."""

    def __init__(self, model_path, image):
        self.model_path, self.image = model_path, image
        super().__init__(f"{model_path}: the scores of image {image} are not finite (float32 overflow): "
                         f"the model's weights, or the images, are too large for float32 inference")

    def shifted(self, offset):
        return ScoresOverflow(self.model_path, self.image + offset)


class AccuracyMismatch(click.ClickException):
    """The run worked but its accuracy is not the expected one (the CI regression check)."""

    exit_code = 1


def where(path, dataset=None):
    """The prefix every loader message starts with: the file, then the dataset."""
    return f"{path}: dataset '{dataset}'" if dataset else f"{path}"


class BadValue(Exception):
    """The GPU or the native CPU network found a value that is not finite in image `image`
    (numbered from the start of the images it was given); the caller reads that image again for
    the message (dataset.bad_value)."""

    def __init__(self, image):
        super().__init__(image)
        self.image = image

    def shifted(self, offset):
        return BadValue(self.image + offset)
