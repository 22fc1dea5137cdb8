"""Mutation testing: does the test suite fail when the code is wrong?

Each line of tools/mutations.txt names a file, an exact piece of its text, what to put there
instead, and the tests that cover it:

    infer/serve/images.py | np.float32(1 / 255) | np.float32(1 / 97) | tests/test_server.py tests/test_page.py

The piece must occur exactly once. Each mutation is applied alone, in a scratch copy of the
checkout (tracked and untracked files, `../shared` beside it as in CI), the named tests run there
(`python -m pytest -q -x`, a time limit each), and the mutation is caught when they fail. A report
of every mutation, caught or survived, is printed and written whole to --report.

    python tools/mutate.py                          # every mutation (about 30 minutes on 2 cores)
    python tools/mutate.py --only server --report /tmp/mutations.txt
    python tools/mutate.py --gpu                    # the kernels' mutations, on a GPU machine

Survivors are either killed by a new test or written in tools/mutations.txt's comments with the
reason they cannot matter.
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "tools" / "mutations.txt"


def mutations(path=LIST, gpu=False):
    """[(line number, file, pattern, replacement, tests)] from the list; a line starting with '#' is a
    comment, and ' ## ' starts a note after the tests. A note starting 'gpu' marks a mutation the GPU
    suite catches: listed only with gpu (and then only those)."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        line, _, note = line.partition(" ## ")
        line = line.strip()
        if not line or note.startswith("gpu") != gpu:
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 4:
            sys.exit(f"{path}:{number}: expected 'file | pattern | replacement | tests', got {line!r}")
        out.append((number, *parts))
    return out


def scratch_copy(into):
    """The checkout's files (tracked and untracked, not ignored) copied into `into`/main, with a
    link to ../shared beside it."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode == 0:
        files = listed.stdout.splitlines()
    else:  # a copy of the tree without git (a GPU machine's): its sources, not what runs leave behind
        skip = {".git", ".device", "__pycache__", ".pytest_cache", "build", "dist"}
        files = [str(f.relative_to(REPO)) for f in REPO.rglob("*")
                 if f.is_file() and not skip & set(f.relative_to(REPO).parts) and ".egg-info" not in str(f)]
    root = Path(into) / "main"
    for f in files:
        src = REPO / f
        if src.is_file():
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / f)
    shared = REPO.parent / "shared"
    if shared.exists():
        (Path(into) / "shared").symlink_to(shared)
    return root


def run_one(root, file, pattern, replacement, tests, timeout):
    """('caught' | 'survived' | 'not found' | 'ambiguous' | 'timeout', seconds)."""
    path = root / file
    original = path.read_text()
    count = original.count(pattern)
    if count != 1:
        return ("not found" if count == 0 else "ambiguous"), 0.0
    path.write_text(original.replace(pattern, replacement))
    t = time.perf_counter()
    # the scratch copy first on the path (before an editable install, or a GPU machine's own packages)
    search = os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = dict(os.environ, PYTHONPATH=search, CNNINFER_CACHE=str(root.parent / "cache"))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *shlex.split(tests)],
                           cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        verdict = "survived" if r.returncode == 0 else "caught" if r.returncode == 1 else f"error {r.returncode}"
    except subprocess.TimeoutExpired:
        verdict = "timeout"
    finally:
        path.write_text(original)
    return verdict, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="only the mutations whose line holds this text")
    ap.add_argument("--lines", help="only the mutations on these lines of mutations.txt (e.g. 7,11,12 or 71-85)")
    ap.add_argument("--gpu", action="store_true", help="the kernels' mutations (notes 'gpu'), for the GPU suite: on a GPU machine")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one mutation's tests")
    ap.add_argument("--report", help="also write the report to this file (whole)")
    args = ap.parse_args()
    lines_wanted = None
    if args.lines:
        spans = [[int(n) for n in part.split("-")] for part in args.lines.split(",")]
        lines_wanted = {n for span in spans for n in range(span[0], span[-1] + 1)}
    todo = [m for m in mutations(gpu=args.gpu) if (not args.only or args.only in " | ".join(m[1:]))
            and (lines_wanted is None or m[0] in lines_wanted)]
    lines = []
    with tempfile.TemporaryDirectory(prefix="cnninfer-mutate-") as tmp:
        root = scratch_copy(tmp)
        for number, file, pattern, replacement, tests in todo:
            verdict, seconds = run_one(root, file, pattern, replacement, tests, args.timeout)
            lines.append(f"{verdict:9} {seconds:6.1f} s  mutations.txt:{number}  {file}: {pattern!r} -> {replacement!r}")
            print(lines[-1], flush=True)
    caught = sum(line.startswith("caught") for line in lines)
    survived = [line for line in lines if not line.startswith("caught")]
    summary = [f"{len(lines)} mutations: {caught} caught, {len(survived)} not caught"] + [f"  {s}" for s in survived]
    print("\n".join(summary))
    if args.report:
        tmp = Path(args.report).with_suffix(".tmp")
        tmp.write_text("\n".join(lines + [""] + summary) + "\n")
        os.replace(tmp, args.report)
    return 0 if not survived else 1


if __name__ == "__main__":
    sys.exit(main())
