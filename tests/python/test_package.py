"""The package's structure: imports only point down, no cycles, and the public API names
every exception its calls raise. Read from the source with ``ast``, so a new module is
checked without being listed here."""

import ast
import os

import hotswitch as hs

PACKAGE = os.path.dirname(os.path.abspath(hs.__file__))
# Lower layers first; a module may import only from its own layer or a lower one. Test
# support sits above the programs: it drives them as tests do.
LAYERS = {"library": 0, "analysis": 1, "cli": 2, "testing": 3, "entry": 4}
# The package's API module and the command-line shims that keep `python -m hotswitch.X` working.
ENTRY_POINTS = {"hotswitch", "hotswitch.train", "hotswitch.launch", "hotswitch.plots", "hotswitch.calibration.__main__",
                "hotswitch.preprocess_data", "hotswitch.train_tokenizer", "hotswitch.convert", "hotswitch.costmodel"}


def package_sources():
    """Module name -> source text of every module of the installed package."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, f), os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                name = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
                with open(os.path.join(root, f)) as fh:
                    out[name] = fh.read()
    return out


def layer(module: str) -> str:
    if module in ENTRY_POINTS:
        return "entry"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("analysis", "testing", "cli") else "library"


def imports(sources, module: str):
    """(imported module, line) for every hotswitch import of ``module``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(sources[module])):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "hotswitch"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hotswitch":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in sources or a.name == "_C" else node.module, node.lineno))
    return out


def through_init(sources):
    return [f"{m}:{line}" for m in sources if m not in ENTRY_POINTS
            for t, line in imports(sources, m) if t == "hotswitch"]


def upward(sources):
    bad = []
    for m in sources:
        for t, line in imports(sources, m):
            if t not in sources or t == "hotswitch":
                continue
            a, b = layer(m), layer(t)
            if LAYERS[b] > LAYERS[a]:
                bad.append(f"{m}:{line} imports {t} ({a} -> {b})")
    return bad


def cycles(sources):
    graph = {m: sorted({t for t, _ in imports(sources, m) if t in sources and t != m}) for m in sources}
    state, stack, found = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == "open":
                found.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


SOURCES = package_sources()


def test_the_package_is_found_and_split_into_layers():
    assert {layer(m) for m in SOURCES} == set(LAYERS)
    assert "hotswitch.runtime" in SOURCES and "hotswitch.cli.train" in SOURCES


def test_no_module_reaches_the_package_through_its_init():
    assert not through_init(SOURCES), "import the defining module instead of hotswitch/__init__"


def test_imports_only_point_down():
    assert not upward(SOURCES)


def test_the_import_graph_has_no_cycles():
    assert not cycles(SOURCES)


def test_the_checks_find_each_defect():
    fake = {"hotswitch": "", "hotswitch.a": "import hotswitch.b\nfrom hotswitch.cli import train\n",
            "hotswitch.b": "def f():\n    import hotswitch.a\n", "hotswitch.cli": "", "hotswitch.cli.train": "",
            "hotswitch.testing": "", "hotswitch.testing.x": "from hotswitch.analysis import y\nimport hotswitch as hs\n",
            "hotswitch.analysis": "", "hotswitch.analysis.y": "from hotswitch.cli import train\n"}
    assert upward(fake) == ["hotswitch.a:2 imports hotswitch.cli.train (library -> cli)",
                            "hotswitch.analysis.y:1 imports hotswitch.cli.train (analysis -> cli)"]
    assert cycles(fake) == ["hotswitch.a -> hotswitch.b -> hotswitch.a"]
    assert through_init(fake) == ["hotswitch.testing.x:2"]


def test_public_api_exports_what_users_need_and_every_error_it_raises():
    for name in ("Runtime", "RuntimeConfig", "StepResult", "switch", "plan_switch", "Layout", "TransformerConfig",
                 "CheckpointError", "NonFiniteLoss", "SwitchFault", "SwitchTimeout"):
        assert name in hs.__all__, name
    for name in hs.__all__:
        assert hasattr(hs, name), name
    # Test references and C++ internals are not the public API.
    for name in ("StaticTrainer", "train_static", "init_full", "PlanCache"):
        assert name not in hs.__all__, name
    assert issubclass(hs.NonFiniteLoss, ValueError) and issubclass(hs.CheckpointError, ValueError)
    assert issubclass(hs.SwitchTimeout, hs.SwitchFault)


def test_the_public_api_is_at_most_25_names_and_the_rest_lives_in_its_modules():
    assert len(hs.__all__) <= 25 and len(set(hs.__all__)) == len(hs.__all__)
    from hotswitch.calibration import calibrate  # noqa: F401
    from hotswitch.distributed import spawn  # noqa: F401
    from hotswitch.hardware import load_profile, save_profile  # noqa: F401
    from hotswitch.logging import get_logger, set_log_level  # noqa: F401
    from hotswitch.model import MicroBatch, ParallelGroups, ParallelTransformer, count_targets, split_replicas  # noqa
    from hotswitch.specs import shard_tensors  # noqa: F401
