"""A run's options are checked where they are made (infer/options.py), on any machine, before a
GPU is asked: each bound refused at its edge, with one line naming the option."""
import pytest

from infer.errors import InputError
from infer.options import Options


@pytest.mark.parametrize("given, words", [
    (dict(streams=64), None),
    (dict(streams=65), "streams must be at most 64"),
    (dict(streams=0), "streams must be a whole number of at least 1"),
    (dict(readers=256), None),
    (dict(readers=257), "readers must be at most 256"),
    (dict(devices=[0, 2]), None),
    (dict(devices="all"), None),
    (dict(devices=[1, 1]), "GPU numbers must be distinct"),
    (dict(devices=[0, -1]), "GPU numbers must be 0 or more"),
    (dict(devices=[]), "GPU numbers must be 0 or more"),
    (dict(devices=["x"]), "a list of GPU numbers or 'all'"),
    (dict(device=True), "device must be a whole number"),
])
def test_bounds_at_their_edges(given, words):
    if words is None:
        options = Options.of(**given)
        for name, value in given.items():
            assert getattr(options, name) == value
        return
    with pytest.raises(InputError, match=words) as e:
        Options.of(**given)
    assert "\n" not in e.value.message
