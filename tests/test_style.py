"""House style (../shared/STYLE.md, "Lines a reader can take in at a glance"): the checkable parts,
over every Python file of the repository. ruff checks and formats the rest (`make lint`).

- An assignment has at most two targets, unless it unpacks a call's result (`q, r = divmod(n, k)`).
- No conditional expression inside another (`a if x else b if y else c`): write an `if` block.
- No generator or comprehension in a `for` header: name the sequence first.

Rule of thumb 4: after `resolve`, `args` is read, never written (what a run computes at run time
lives in its runtime record). Only `parse_args` and `resolve` assign to `args`, in every root
script and bench/*.py.
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


# ------------------------------------------------------------- args is written only at parse time
# functions that may write args: parse_args, resolve, and common.py's two parse-time helpers that
# parse_args calls for --resume (resume_from restores the saved flags through resume_args)
WRITES_ARGS = {"parse_args", "resolve"}
WRITES_ARGS_IN = {"runs.py": {"resume_from", "resume_args"}}
# the dict methods that change vars(args) (`vars(args).items()` only reads it)
DICT_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def root_name(node):
    """The name an attribute/subscript chain hangs from (`args` for `args.a.b[0]`), or None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    return None


def is_vars_of_args(node):
    """`vars(args)`."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "vars"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "args"
    )


def writes_args(node):
    """What `node` itself writes into args, or None: `args.x = / += / del`, `args.x[i] = `,
    `setattr(args, ...)`, `vars(args)[k] = ...`, `vars(args).update(...)`. A subscript of another
    object (`ban[i, : args.n] = True`) writes that object, not args."""
    if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(
        node.ctx, (ast.Store, ast.Del)
    ):
        chain = node
        has_attribute = False
        while isinstance(chain, (ast.Attribute, ast.Subscript)):
            has_attribute = has_attribute or isinstance(chain, ast.Attribute)
            chain = chain.value
        if has_attribute and isinstance(chain, ast.Name) and chain.id == "args":
            return "assigns args." + ast.unparse(node).removeprefix("args.")
        if is_vars_of_args(chain):
            return "writes vars(args)"
    if isinstance(node, ast.Call):
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and node.args
            and root_name(node.args[0]) == "args"
        ):
            return "calls setattr(args, ...)"
        if (
            isinstance(func, ast.Attribute)
            and is_vars_of_args(func.value)
            and func.attr in DICT_WRITES
        ):
            return f"calls vars(args).{func.attr}(...)"
    return None


def args_writes(source, path):
    """Every write to args outside the functions allowed to make one, as `path:line: function
    what`."""
    allowed = WRITES_ARGS | WRITES_ARGS_IN.get(os.path.basename(path), set())
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        what = writes_args(node)
        if what and function not in allowed:
            found.append(f"{path}:{node.lineno}: {function} {what}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source, path), "<module>")
    return found


def scripts():
    """The root scripts, the benches and course/ (not the tests)."""
    found = []
    for path in python_files():
        if os.path.dirname(path) in ("", "bench", "course"):
            found.append(path)
    return found


def test_the_args_check_catches_each_way_of_writing_args():
    writes = [
        "args.lr = 1.0",
        "args.n += 1",
        "args.sizes[0] = 2",
        "args.a, b = f()",
        "setattr(args, 'lr', 1.0)",
        "vars(args).update(lr=1.0)",
        "vars(args).pop('lr')",
        "vars(args)['lr'] = 1.0",
        "del args.lr",
    ]
    for line in writes:
        source = f"def main(args):\n    {line}\n"
        assert len(args_writes(source, "x.py")) == 1, line
        for name in sorted(WRITES_ARGS):
            assert args_writes(source.replace("main", name), "x.py") == [], (name, line)
    assert len(args_writes("args = f()\nargs.lr = 1.0\n", "x.py")) == 1  # module level too
    # the resume helpers of runs.py that parse_args calls may write args there, and nowhere else
    helper = "def resume_args(args):\n    args.lr = 1.0\n"
    assert args_writes(helper, "runs.py") == []
    assert len(args_writes(helper, "grpo.py")) == 1
    reads = "\n".join(
        [
            "def main(args, ban):",
            "    ban[0, 1 : 1 + args.min_tokens] = True",
            "    x = args.lr",
            "    y = vars(args)",
            "    z = dict(vars(args))",
            "    w = {k: v for k, v in vars(args).items()}",
            "    z['lr'] = 2.0",
            "    other.lr = args.lr",
            "    setattr(other, 'lr', args.lr)",
        ]
    )
    assert args_writes(reads, "x.py") == []


@pytest.mark.parametrize("path", scripts())
def test_args_is_written_only_at_parse_time(path):
    with open(os.path.join(ROOT, path)) as f:
        source = f.read()
    assert args_writes(source, path) == []


# ------------------------------------------------------------- no reaching into another's privates
def private_uses(source, path):
    """Every use of another root module's private name (`grpo._forwards`), as `path:line: name`: a
    function another script calls is public, with a plain name."""
    local = set()  # what this file calls the repository's root modules it imports
    tree = ast.parse(source, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if os.path.isfile(os.path.join(ROOT, alias.name + ".py")):
                    local.add(alias.asname or alias.name)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in local
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_private_check_catches_a_call_of_another_modules_private_function():
    assert private_uses("import grpo\ngrpo._forwards(x)\n", "x.py") == ["x.py:2: grpo._forwards"]
    assert private_uses("import rollout as engines\nengines._device_ctx(x)\n", "x.py") != []
    assert private_uses("import grpo\ngrpo.forward_passes(x)\nos._exit(0)\n", "x.py") == []


# the benches that instrument a private function from outside (what they measure is inside it)
INSTRUMENTED = {
    "bench/grpo_step.py": ["grpo._updates"],  # wrapped to time the training part of a step
    "bench/grader_throughput.py": ["grader._sympy_equal_any_thread"],  # its cache cleared
}


@pytest.mark.parametrize("path", scripts())
def test_scripts_call_no_private_function_of_another(path):
    with open(os.path.join(ROOT, path)) as f:
        source = f.read()
    found = []
    for use in private_uses(source, path):
        if use.split(": ")[1] not in INSTRUMENTED.get(path, []):
            found.append(use)
    assert found == []
