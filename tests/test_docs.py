"""The documentation as a reader meets it: every command and every option of the command line is
named in README.md or docs/, README stays within 200 lines and each docs page within 400, and the
pages README points to exist."""
import re

import click
import pytest

from infer.cli import cli
from tests.conftest import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))


def documented():
    return "\n".join(p.read_text() for p in [README, *PAGES])


def commands():
    return sorted(cli.commands.items())


@pytest.mark.parametrize("name,command", commands(), ids=[n for n, _ in commands()])
def test_every_command_and_option_is_documented(name, command):
    text = documented()
    assert f"cnninfer {name}" in text, f"command {name}"
    missing = [opt for p in command.params if isinstance(p, click.Option) and not p.hidden
               for opt in p.opts if opt.startswith("--") and not re.search(rf"{re.escape(opt)}\b", text)]
    assert not missing, f"{name}: options named nowhere in README.md or docs/: {missing}"


def test_readme_and_pages_stay_within_their_lengths():
    assert len(README.read_text().splitlines()) <= 200
    for page in PAGES:
        assert len(page.read_text().splitlines()) <= 400, page.name


def test_the_pages_readme_points_to_exist():
    linked = re.findall(r"\]\((docs/[\w.-]+\.md)\)", README.read_text())
    assert linked and all((REPO / link).is_file() for link in linked)
    assert {p.name for p in PAGES} <= {link.split("/")[1] for link in linked}, "every page is linked from README"
