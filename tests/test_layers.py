"""The layers finetune/__init__.py states hold in the code: each sub-package imports only those below it
(system <- data <- vits <- reporting <- training <- the recipes' shared modules <- feedback), and no modules
import each other in a circle. Every import counts, function-local ones included; only those under `if TYPE_CHECKING:`
(annotations, never run) may close a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

LAYERS = ("system", "data", "vits", "reporting", "training")  # bottom to top
TOP = len(LAYERS)  # finetune/__init__.py, cli.py, settings.py, recipes/: what the recipe scripts build on
FEATURES = ("feedback",)  # above them all: a feature's own package may import every layer; none imports it


def package_sources(root: Path = REPO) -> dict[str, str]:
    """Each module of finetune/ by its dotted name, with its source."""
    sources = {}
    for path in sorted((root / "finetune").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        sources[name.removesuffix(".__init__")] = path.read_text(encoding="utf-8")
    return sources


def rank(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FEATURES:
        return TOP + 1
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else TOP


def imports(module: str, source: str, known: set[str]) -> tuple[set[str], set[str]]:
    """The finetune modules `module` imports: (all of them, those that run: not under TYPE_CHECKING)."""
    tree = ast.parse(source)
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for statement in node.body for child in ast.walk(statement))
    every, running = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from finetune.vits import generator` imports the module finetune.vits.generator
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found = {name for name in names if name in known and name != module and name != "finetune"}
        every |= found
        if id(node) not in typing_only:
            running |= found
    return every, running


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def layer_problems(sources: dict[str, str]) -> list[str]:
    known = set(sources)
    problems, running_graph = [], {}
    for module, source in sources.items():
        every, running = imports(module, source, known)
        running_graph[module] = running
        for target in sorted(every):
            if rank(target) > rank(module):
                problems.append(f"upward import: {module} imports {target}")
    problems += [f"import circle: {' <-> '.join(group)}" for group in circles(running_graph)]
    return problems


def test_the_package_keeps_its_layers_and_has_no_import_circle():
    assert layer_problems(package_sources()) == []


def test_a_planted_upward_import_fails_even_inside_a_function():
    sources = package_sources()
    sources["finetune.data.audio"] += "\n\ndef planted():\n    from finetune.training import loop\n"
    problems = layer_problems(sources)
    assert "upward import: finetune.data.audio imports finetune.training.loop" in problems
    assert all("finetune.data.audio" in problem for problem in problems)  # and the circle it closes


def test_the_loop_names_no_feature():
    """The generic loop takes a round's evaluator through a declared interface (RunEvaluator), never by
    importing the feature or probing it: nothing below finetune/feedback/ imports it, and a planted import fails."""
    sources = package_sources()
    assert any(name.startswith("finetune.feedback.") for name in sources)
    sources["finetune.training.loop"] += "\nfrom finetune.feedback import round_evaluator\n"
    assert "upward import: finetune.training.loop imports finetune.feedback.round_evaluator" in layer_problems(sources)
    sources = package_sources()
    sources["finetune.recipes.shared"] += "\nfrom finetune.feedback import versions\n"
    assert "upward import: finetune.recipes.shared imports finetune.feedback.versions" in layer_problems(sources)
    probes = [
        f"{path.name}: {line.strip()}"
        for path in (REPO / "finetune" / "training").glob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if "evaluator" in line and ("getattr(" in line or "hasattr(" in line)
    ]
    assert not probes, probes


def test_a_planted_circle_fails_unless_one_side_is_for_annotations_only():
    sources = package_sources()
    sources["finetune.system.atomic"] += "\nfrom finetune.system import disk\n"
    sources["finetune.system.disk"] += "\nimport finetune.system.atomic\n"
    assert layer_problems(sources) == ["import circle: finetune.system.atomic <-> finetune.system.disk"]
    sources["finetune.system.disk"] = sources["finetune.system.disk"].replace(
        "\nimport finetune.system.atomic\n", "\nif TYPE_CHECKING:\n    import finetune.system.atomic\n"
    )
    assert layer_problems(sources) == []


MAX_ATTRIBUTES = 15  # what one reader holds in mind of a class in finetune/training/


def attributes_set(source: str) -> dict[str, set[str]]:
    """Class name -> the attributes its methods assign on `self` (self.x = ..., self.x, self.y = ...)."""
    found = {}
    for cls in [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]:
        names = set()
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                        names.add(item.attr)
        found[cls.name] = names
    return found


def test_no_class_of_the_training_machinery_holds_more_than_a_reader_can():
    crowded = {
        f"{path.name}: {name} ({len(names)}: {sorted(names)})"
        for path in (REPO / "finetune" / "training").glob("*.py")
        for name, names in attributes_set(path.read_text(encoding="utf-8")).items()
        if len(names) > MAX_ATTRIBUTES
    }
    assert not crowded, f"split these along their seams: {crowded}"


def test_the_attribute_count_sees_tuples_and_annotated_assignments():
    planted = "class Many:\n    def __init__(self):\n        self.a, self.b = 1, 2\n        self.c: int = 3\n        self.d.e = 4\n"
    assert attributes_set(planted) == {"Many": {"a", "b", "c"}}
