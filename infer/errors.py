"""Errors the command line turns into one line on stderr and an exit code, never a traceback."""
import click


class InputError(click.ClickException):
    """Bad input from the user (a file, a dataset, an option): exit code 2."""

    exit_code = 2


class BackendUnavailable(InputError):
    """A backend that was asked for cannot run on this machine: exit code 2."""


class AccuracyMismatch(click.ClickException):
    """The run worked but its accuracy is not the expected one (the CI regression check)."""

    exit_code = 1


def where(path, dataset=None):
    """The prefix every loader message starts with: the file, then the dataset."""
    return f"{path}: dataset '{dataset}'" if dataset else f"{path}"
