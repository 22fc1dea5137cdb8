"""A Session as the most natural scripts use it, each script in a fresh interpreter with a time
limit: left open at exit, dropped in a function, collected on another thread, used after fork.
The exit status and every line on stderr are checked: a Session releases its resources quietly
(exit 0, nothing printed), and a GPU Session in a forked child refuses at once in one line."""
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

LIMIT_S = 60

PRELUDE = """
import gc, os, sys, threading
import h5py, numpy as np
import cnninfer
from cnninfer import ForkedSession
x = h5py.File(os.path.join({data!r}, "test100.hdf5"))["x"][:37]
model = os.path.join({data!r}, "model.hdf5")
expected = {expected!r}
backend = {backend!r}
"""


def script(ece408, backend, body, expected):
    return PRELUDE.format(data=str(ece408), expected=expected, backend=backend) + textwrap.dedent(body)


def run_script(code):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=LIMIT_S)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def expected(ece408):
    import h5py

    from infer import reference
    from infer.data.loader import load_model

    with h5py.File(ece408 / "test100.hdf5") as f:
        return reference.forward(f["x"][:37], load_model(ece408 / "model.hdf5")).tolist()


LEFT_OPEN = """
s = cnninfer.Session(model, backend)
print(s.predict(x).tolist() == expected)
"""

DROPPED = """
def once():
    s = cnninfer.Session(model, backend)
    return s.predict(x).tolist()
for _ in range(3):
    print(once() == expected)
    gc.collect()
"""

DROPPED_ON_ANOTHER_THREAD = """
sessions = [cnninfer.Session(model, backend)]
print(sessions[0].predict(x).tolist() == expected)
t = threading.Thread(target=lambda: (sessions.clear(), gc.collect()))
t.start(); t.join()
print(cnninfer.Session(model, backend).predict(x).tolist() == expected)
"""

SCRIPTS = {"left open at exit": (LEFT_OPEN, 1), "dropped in a function": (DROPPED, 3),
           "dropped on another thread": (DROPPED_ON_ANOTHER_THREAD, 2)}


def check_quiet(rc, out, err, answers):
    assert rc == 0, (rc, err)
    assert err == "", err
    assert out.split() == ["True"] * answers, out


@pytest.mark.parametrize("case", SCRIPTS)
def test_a_cpu_session_is_released_quietly(ece408, expected, case):
    body, answers = SCRIPTS[case]
    check_quiet(*run_script(script(ece408, "cpu", body, expected)), answers)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SCRIPTS)
def test_a_gpu_session_is_released_quietly(ece408, expected, case):
    """The PyCUDA abort this replaced: exit 134, 'The context stack was not empty upon module cleanup'."""
    body, answers = SCRIPTS[case]
    check_quiet(*run_script(script(ece408, "cuda", body, expected)), answers)


FORKED = """
import warnings  # Python 3.12 warns of any fork in a process with threads: this script forks on purpose
warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
s = cnninfer.Session(model, backend)
print(s.predict(x).tolist() == expected)
pid = os.fork()
if pid == 0:
    try:
        labels = s.predict(x)
        print("child", labels.tolist() == expected)
    except ForkedSession as e:
        print("child refused", type(e).__mro__[1].__name__, len(str(e).splitlines()), "make the Session in the child" in str(e))
    sys.stdout.flush()
    os._exit(0) if {hard_exit} else sys.exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status))
print(s.predict(x).tolist() == expected)
s.close()
"""


@pytest.mark.parametrize("hard_exit", [True, False], ids=["os._exit", "interpreter exit"])
def test_a_cpu_session_works_in_a_forked_child(ece408, expected, hard_exit):
    rc, out, err = run_script(script(ece408, "cpu", FORKED.replace("{hard_exit}", str(hard_exit)), expected))
    assert rc == 0 and err == "", (rc, err)
    assert out.splitlines() == ["True", "child True", "child exit 0", "True"], out


@pytest.mark.gpu
@pytest.mark.parametrize("hard_exit", [True, False], ids=["os._exit", "interpreter exit"])
def test_a_gpu_session_refuses_at_once_in_a_forked_child(ece408, expected, hard_exit):
    rc, out, err = run_script(script(ece408, "cuda", FORKED.replace("{hard_exit}", str(hard_exit)), expected))
    assert rc == 0 and err == "", (rc, err)
    assert out.splitlines() == ["True", "child refused RuntimeError 1 True", "child exit 0", "True"], out


def test_the_cpu_fallback_notice_is_said_once_a_process(ece408, expected):
    """Three Sessions with backend auto on a machine whose CUDA backend cannot start: one notice."""
    body = """
    import infer.gpu
    from infer.errors import BackendUnavailable
    def no_gpu(**options):
        raise BackendUnavailable("no CUDA GPU is visible")
    infer.gpu.create = no_gpu
    for _ in range(3):
        with cnninfer.Session(model) as s:
            print(s.predict(x).tolist() == expected)
    """
    rc, out, err = run_script(script(ece408, "auto", body, expected))
    assert rc == 0 and out.split() == ["True"] * 3, (rc, out, err)
    assert err.splitlines() == ["cnninfer: CUDA backend not usable (no CUDA GPU is visible); using the CPU backend"]


def test_a_dropped_cpu_session_releases_its_threads(ece408, expected):
    """Dropped without close() and collected, a Session's backend is closed (weakref.finalize): its
    compute and reader threads end, here and not only at exit."""
    body = """
    def live():
        return sorted(t.name.rsplit("_", 1)[0] for t in threading.enumerate() if t.name.startswith("cnninfer-"))
    s = cnninfer.Session(model, backend)
    print(s.evaluate(os.path.join(os.path.dirname(model), "test100.hdf5")).correct)
    print("open", bool(live()))
    del s
    gc.collect()
    for _ in range(200):
        if not live():
            break
        threading.Event().wait(0.01)
    print("after", live())
    """
    rc, out, err = run_script(script(ece408, "cpu", body, expected))
    assert rc == 0 and err == "", (rc, err)
    assert out.splitlines() == ["95", "open True", "after []"], out
