"""tools/mutations.txt stays true to the code: each mutation's text occurs exactly once in its file
(as tools/mutate.py requires) and the tests it names exist, so a change that moves the text is
noticed here rather than as a failed mutation run."""
import shlex
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import mutate  # noqa: E402

LISTED = mutate.mutations() + mutate.mutations(gpu=True)


@pytest.mark.parametrize("number,path,pattern,replacement,tests", LISTED, ids=[f"line{m[0]}" for m in LISTED])
def test_each_mutation_names_text_found_once_and_tests_that_exist(number, path, pattern, replacement, tests):
    text = (REPO / path).read_text()
    assert text.count(pattern) == 1, f"mutations.txt:{number}: {pattern!r} occurs {text.count(pattern)} times in {path}"
    assert pattern != replacement
    for test in shlex.split(tests):
        if test.startswith("tests/"):  # (pytest's options, as -k EXPR, pass through)
            assert (REPO / test.split("::")[0]).exists(), f"mutations.txt:{number}: no {test}"
