"""The house's layers (../shared/STYLE.md, "The house"): every root script imports only from a lower
layer, function-level imports included, so the import graph has no cycle and a shared helper lives
below every file that uses it. LAYERS is the one list, bottom first; the README's file table shows
the same layer for each file (checked here).

A new root file gets a line in LAYERS: in the lowest layer above everything it imports. The folders
of ABOVE sit over every layer: their files import root scripts, and no root script imports them.
"""

import ast
import os
import re

from conftest import ROOT, doc_section

LAYERS = [  # bottom first: a file imports only from the layers before its own
    ("errors and flags, the metric table, storage errors", ["common", "metric_table", "storage"]),
    ("pure tensor and reward functions, the sandbox", ["losses", "grader", "sandbox"]),
    ("task data, LoRA, hardware, FSDP2 sharding", ["data", "lora", "hardware", "sharding"]),
    ("a run on disk", ["runs"]),
    ("engines", ["rollout"]),
    ("the multi-turn loop with tools", ["tools"]),
    ("validation, plots", ["validation", "plot"]),
    ("scripts", ["doctor", "convert_lm", "kissing", "eval_zero_shot", "sft"]),
    ("scripts on scripts", ["best_of_n", "grpo"]),
    ("scripts on grpo.py", ["expert_iteration", "grpo_ray"]),
]
ABOVE = ["bench", "course"]  # the benchmarks; the course's test hooks and their runner


def layer_of():
    """module -> its layer's index in LAYERS."""
    index = {}
    for i, (_, modules) in enumerate(LAYERS):
        for module in modules:
            index[module] = i
    return index


def root_modules():
    names = []
    for name in sorted(os.listdir(ROOT)):
        if name.endswith(".py"):
            names.append(name[:-3])
    return names


def imports_of(source, project):
    """{imported project module: first line number} of every import in the source, at any depth
    (function-level imports included)."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        for name in names:
            if name in project:
                found.setdefault(name, node.lineno)
    return found


def import_graph():
    """{module: {imported project module: line}} over every root script."""
    project = set(root_modules())
    graph = {}
    for module in sorted(project):
        with open(os.path.join(ROOT, f"{module}.py")) as f:
            graph[module] = imports_of(f.read(), project - {module})
    return graph


def cycles(graph):
    """The import cycles of a graph, each as a list of modules (depth-first search)."""
    found = []
    state = {}  # module -> "open" while on the current path, "done" after

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph.get(module, {})):
            if state.get(other) == "open":
                found.append(path[path.index(other) :] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def upward_imports(graph, layers):
    """'a.py:12 imports b (layer 3) from layer 2' for every import that is not strictly downward."""
    found = []
    for module, imported in sorted(graph.items()):
        for other, line in sorted(imported.items()):
            if layers[other] >= layers[module]:
                found.append(
                    f"{module}.py:{line} imports {other} (layer {layers[other]}) from layer "
                    f"{layers[module]}"
                )
    return found


def found_layers(graph):
    """The layering the imports themselves imply: a module's depth is 1 + its deepest import's
    (printed when the check fails, so the fix is to read off)."""
    depth = {}

    def of(module, seen=()):
        if module in seen:
            return 0  # a cycle: reported separately
        if module not in depth:
            deeper = [of(other, seen + (module,)) + 1 for other in graph.get(module, {})]
            depth[module] = max(deeper, default=0)
        return depth[module]

    rows = {}
    for module in graph:
        rows.setdefault(of(module), []).append(module)
    return "\n".join(f"  {d}: {', '.join(sorted(rows[d]))}" for d in sorted(rows))


# ----------------------------------------------------------------------------- tests
def test_the_checks_catch_a_cycle_and_an_upward_import():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    layers = {"a": 2, "b": 1, "c": 0, "d": 3}
    assert upward_imports(graph, layers) == ["c.py:7 imports a (layer 2) from layer 0"]
    source = "import os\nimport b\n\ndef f():\n    from c import x\n    import d.e\n"
    assert imports_of(source, {"b", "c", "d"}) == {"b": 2, "c": 5, "d": 6}


def test_every_root_script_has_one_layer():
    listed = []
    for _, modules in LAYERS:
        listed += modules
    assert len(listed) == len(set(listed)), "a module is in two layers"
    assert sorted(listed) == root_modules(), "add the new root file to LAYERS (its lowest layer)"


def test_imports_go_down_only_and_never_in_a_cycle():
    graph = import_graph()
    found = cycles(graph) + upward_imports(graph, layer_of())
    message = "\n".join(str(f) for f in found)
    assert not found, f"{message}\nthe layers the imports imply:\n{found_layers(graph)}"


def test_no_root_script_imports_a_folder_above_the_layers():
    found = []
    for module in root_modules():
        with open(os.path.join(ROOT, f"{module}.py")) as f:
            for folder, line in imports_of(f.read(), set(ABOVE)).items():
                found.append(f"{module}.py:{line} imports {folder}/")
    assert found == []


def test_the_readme_file_table_shows_each_files_layer():
    """Each root file's row in the README's file table names its layer as LAYERS does."""
    table = doc_section("Files")
    layers = layer_of()
    for module in root_modules():
        rows = re.findall(rf"^\|\s*`{module}\.py`\s*\|\s*(\d+)\s*\|", table, re.M)
        assert rows == [str(layers[module])], f"{module}.py: layer {layers[module]} in the table"
