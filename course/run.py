"""Run the course's own tests (stanford-cs336/assignment5-alignment, its tests/ folder) against
this project, with course/adapters.py in place of the course's stub adapters.

The handouts say "implement adapters.run_..., then run `uv run pytest -k test_...`"; here the
adapters are written, and this script is the one command. It copies the course's tests/ into a
temporary folder, puts our adapters.py over theirs, and runs pytest there with this repository on
PYTHONPATH, so nothing of the course's enters this tree, and `tests/test_grpo.py` in a handout's
command is the course's file, not ours. The temporary folder is removed afterwards.

Everything after the course folder goes to pytest as a handout writes it. Two of the course's
tests load Qwen2.5-Math-1.5B from the course's cluster path; --model points them elsewhere.

    python course/run.py ~/assignment5-alignment
    python course/run.py ~/assignment5-alignment -k test_compute_grpo_clip_loss
    python course/run.py ~/assignment5-alignment tests/test_grpo.py::test_masked_mean_dim0
    python course/run.py --model ~/models/Qwen2.5-Math-1.5B ~/assignment5-alignment -rA
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# appended to the copy's conftest.py: a later fixture of the same name replaces the course's
MODEL_FIXTURE = "\n\n@pytest.fixture\ndef model_id():\n    return {path!r}\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default=None,
        help="a local Qwen2.5-Math-1.5B snapshot for test_tokenize_prompt_and_output and "
        "test_get_response_log_probs (default: the course's /data/a5-alignment/... path)",
    )
    parser.add_argument(
        "course",
        help="the course repository's checkout (or its tests/ folder)",
    )
    parser.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        help="passed to pytest, run from the scratch folder (-k ..., tests/test_sft.py::...)",
    )
    return parser.parse_args(argv)


def course_tests(course):
    """The course's tests/ folder: `course` itself or its tests/; one line if neither holds the
    course's adapters.py."""
    for folder in (os.path.join(course, "tests"), course):
        if os.path.isfile(os.path.join(folder, "adapters.py")):
            return folder
    sys.exit(f"error: no tests/adapters.py under {course}; pass the assignment5-alignment checkout")


def main(argv=None):
    args = parse_args(argv)
    source = course_tests(args.course)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # the DPO test asks the hub for "gpt2": offline, it fails at once instead of after retries
    env.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="course-tests-") as scratch:
        tests = os.path.join(scratch, "tests")
        shutil.copytree(source, tests, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copyfile(os.path.join(HERE, "adapters.py"), os.path.join(tests, "adapters.py"))
        if args.model:
            with open(os.path.join(tests, "conftest.py"), "a") as f:
                f.write(MODEL_FIXTURE.format(path=os.path.abspath(args.model)))
        # run from the scratch folder: the course's snapshots are read from tests/_snapshots
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args]
        code = subprocess.run(command, cwd=scratch, env=env).returncode
    return code


if __name__ == "__main__":
    sys.exit(main())
