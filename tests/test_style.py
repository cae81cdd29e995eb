"""House style (../shared/STYLE.md, "Lines a reader can take in at a glance"): the checkable parts,
over every Python file of the repository. ruff checks and formats the rest (`make lint`).

- An assignment has at most two targets, unless it unpacks a call's result (`q, r = divmod(n, k)`).
- No conditional expression inside another (`a if x else b if y else c`): write an `if` block.
- No generator or comprehension in a `for` header: name the sequence first.
"""

import ast
import os
import subprocess

import pytest

from conftest import ROOT


def python_files():
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(path for path in listed if os.path.isfile(os.path.join(ROOT, path)))


def targets_of(node):
    """How many names an assignment binds at top level: `a, b = ...` and `a = b = ...` bind 2."""
    count = 0
    for target in node.targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            count += len(target.elts)
        else:
            count += 1
    return count


def problems(source, path):
    found = []
    for node in ast.walk(ast.parse(source, path)):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if (
            isinstance(node, ast.Assign)
            and targets_of(node) > 2
            and not isinstance(node.value, ast.Call)
        ):
            found.append(f"{where}: {targets_of(node)} values in one assignment")
        if isinstance(node, ast.IfExp):
            for part in (node.body, node.orelse, node.test):
                if isinstance(part, ast.IfExp):
                    found.append(f"{where}: a conditional expression inside another")
        if isinstance(node, (ast.For, ast.AsyncFor)):
            for inner in ast.walk(node.iter):
                if isinstance(inner, (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)):
                    found.append(f"{where}: a comprehension in a for header")
                    break
    return found


def test_the_checks_catch_what_they_name():
    bad = "\n".join(
        [
            "a, b, c = 1, 2, 3",
            "x = 1 if a else 2 if b else 3",
            "for i in (j for j in range(3)):",
            "    pass",
        ]
    )
    assert len(problems(bad, "bad.py")) == 3
    good = "\n".join(
        [
            "q, r = divmod(7, 2)",
            "a, b, c = f()",
            "x = 1 if a else 2",
            "for i in range(3):",
            "    pass",
        ]
    )
    assert problems(good, "good.py") == []


@pytest.mark.parametrize("path", python_files())
def test_plain_lines(path):
    with open(os.path.join(ROOT, path)) as f:
        source = f.read()
    assert problems(source, path) == []
