"""The library's errors: plain Python exceptions (the library never imports click); the command
line turns them into one line on stderr and an exit code, never a traceback."""


class InputError(ValueError):
    """Bad input from the user (a file, a dataset, an option, an array): a ValueError to Python
    callers, exit code 2 on the command line."""

    exit_code = 2

    def __init__(self, message):
        super().__init__(message)
        self.message = message


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


def about_request(e, label="body"):
    """An InputError from a forward pass, as one line about a request's `label`: no server paths."""
    if isinstance(e, ScoresOverflow):
        return (f"{label}: the scores of image {e.image} are not finite (float32 overflow): its values are too "
                f"large for the model")
    return e.message


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


class ForkedSession(RuntimeError):
    """A GPU Session used in a process forked from the one that made it (CUDA does not survive
    fork): the child must make its own."""
