"""The package's shape (docs/architecture.md), kept from drifting: layers, no cycles, plug-ins that agree.

The import graph is read from the source by ``tools/import_graph.py`` (imports inside functions
counted too: such an import may save start-up time, never dodge a cycle), and every module is
imported on its own in a fresh interpreter (one that has imported torch, and no module of the package).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import subprocess
import sys


from conftest import REPO

spec = importlib.util.spec_from_file_location("import_graph", REPO / "tools" / "import_graph.py")
import_graph = sys.modules["import_graph"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)

# Lowest first; a module may import its own layer and the layers below, never one above.
LAYERS = [
    ("core", ["errors", "machine", "console", "cost", "chat", "results", "artifacts", "tokenizer", "runtimes",
              "runtimes.base", "runtimes.engine_loop", "model", "model.catalog", "model.families", "model.gguf",
              "model.builtin", ""]),
    ("tasks", ["tasks", "tasks.*"]),
    ("config", ["config"]),
    ("services", ["checkpoint", "calibration", "model.source", "endpoints", "client", "served_model", "gating",
                  "triton", "triton.*"]),
    # The OpenAI front: a service over the client and the contract (above them), run by `serve`; no backend
    # and no stage below it.
    ("fronts", ["openai", "openai.*"]),
    ("backends", ["runtimes.*"]),
    ("stages", ["quantize", "build", "generate", "eval", "gate", "deploy", "serve", "bench", "bench.*", "report",
                "doctor"]),
    ("orchestrators", ["__main__", "cli", "demo"]),
]
# A stage never imports another stage, except the one whose artifact it re-makes when stale.
UPSTREAM = {"build": {"quantize"}, "serve": {"deploy"}}
# The stages that must ask the selected backend instead of naming one.
BACKEND_NEUTRAL = ("build", "deploy", "serve")
# GPU-only packages a module may import at its top (a CUDA kernel module): missing here, the module is
# not importable, which is not a fault of the package's shape.
OPTIONAL_PACKAGES = ("tensorrt_llm", "triton")

EDGES = import_graph.edges()
MODULES = sorted(import_graph.module_files())


def layer(module: str) -> int:
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return rank
    raise AssertionError(f"{module} has no layer: add it to LAYERS here and to docs/architecture.md")


def stage(module: str) -> str | None:
    """The stage a module belongs to (``bench.load`` is part of ``bench``), or None."""
    top = module.split(".")[0]
    return top if LAYERS[layer(module)][0] == "stages" else None


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


def test_no_import_cycle_not_even_through_imports_inside_functions():
    assert import_graph.cycles(import_graph.graph(all_imports=True)) == []


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{e.source} ({LAYERS[layer(e.source)][0]}) -> {e.target} ({LAYERS[layer(e.target)][0]})"
              for e in EDGES if layer(e.target) > layer(e.source)]
    assert upward == []


def test_no_stage_imports_a_sibling_stage():
    sideways = [f"{e.source} -> {e.target}" for e in EDGES
                if stage(e.source) and stage(e.target) and stage(e.source) != stage(e.target)
                and stage(e.target) not in UPSTREAM.get(stage(e.source), ())]
    assert sideways == []


def test_no_submodule_imports_its_own_package_init():
    # The package is still initializing when its __init__ imports the submodule.
    inward = [f"{e.source} -> {e.target}" for e in EDGES
              if e.target and e.source.startswith(e.target + ".") and e.target in MODULES]
    assert inward == []


def test_stages_that_build_deploy_and_serve_never_test_a_backend_name():
    from trtllm_pipeline.config import BACKEND_NAMES

    for name in BACKEND_NEUTRAL:
        tree = ast.parse((REPO / "trtllm_pipeline" / f"{name}.py").read_text())
        tested = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                  and any(isinstance(c, ast.Constant) and c.value in BACKEND_NAMES for c in ast.walk(node))]
        assert tested == [], f"{name}.py branches on a backend's name: ask the backend (runtimes.registry) instead"


# Imports each module named on its command line in a process of its own, forked from this fresh interpreter once it
# has imported torch and nothing else: no module of the package is imported before the one under test, as in a bare
# `python -c "import trtllm_pipeline.X"`, whose exit code and stderr each child's are. torch (what half the modules
# import first) is the same whoever imports it; importing it in every interpreter anew took 2.5 s of CPU each, two
# minutes over the package.
_IMPORT_EACH_ALONE = r"""
import importlib, json, os, sys, traceback
import torch  # noqa: F401
assert not [m for m in sys.modules if m.split(".")[0] == "trtllm_pipeline"]
for name in sys.argv[1:]:
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 2)
        sys.stderr = os.fdopen(2, "w")
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        err = pipe.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps({"name": name, "code": code, "err": err.strip()}), flush=True)
"""


def _import_each_alone(modules: list[str]) -> list[tuple[str, int, str]]:
    names = ["trtllm_pipeline" + (f".{m}" if m else "") for m in modules]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH_ALONE, *names], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["name"] for r in rows] == names, proc.stderr[-3000:]
    return [(m, r["code"], r["err"]) for m, r in zip(modules, rows)]


def _lacks_optional_package(stderr: str) -> bool:
    last = stderr.splitlines()[-1] if stderr else ""
    return any(last == f"ModuleNotFoundError: No module named '{p}'" for p in OPTIONAL_PACKAGES)


def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    # `__main__` would run the CLI; it is the three lines that call cli.main, imported with cli.
    modules = [m for m in MODULES if m != "__main__"]
    failed = [(m, err[-2000:]) for m, code, err in _import_each_alone(modules)
              if code != 0 and not _lacks_optional_package(err)]
    assert failed == []


# --------------------------------------------------------------------------- the plug-in points


def test_config_names_every_registered_backend():
    from trtllm_pipeline.config import BACKEND_NAMES
    from trtllm_pipeline.runtimes.registry import BACKENDS

    assert tuple(BACKENDS) == BACKEND_NAMES
    assert all(name == b.name for name, b in BACKENDS.items())


def test_tasks_register_under_their_own_names():
    from trtllm_pipeline.config import EvaluationSection
    from trtllm_pipeline.tasks.registry import TASKS

    assert all(name == task.name for name, task in TASKS.items())
    assert EvaluationSection().tasks == list(TASKS)


def test_runtimes_and_the_served_model_are_what_tasks_need():
    from trtllm_pipeline.runtimes.base import Runtime
    from trtllm_pipeline.runtimes.registry import BACKENDS
    from trtllm_pipeline.served_model import ServedModel
    from trtllm_pipeline.tasks.model import LanguageModel

    needed = [n for n in dir(LanguageModel) if not n.startswith("_")]
    assert set(needed) >= {"score", "generate", "describe", "close"}
    for cls in (Runtime, ServedModel, *(b.runtime_class() for b in BACKENDS.values())):
        missing = [n for n in needed if n not in ("tokenizer", "max_seq_len") and not callable(getattr(cls, n, None))]
        assert missing == [], f"{cls.__name__} lacks {missing}"


# --------------------------------------------------------------------------- tensor parallelism


def test_the_tensor_parallel_package_sits_behind_the_torch_runtime_seam():
    # runtimes/torch_engine/tp is the torch runtime's TpExecutor and what it needs; the stages reach it only through
    # TorchRuntime (docs/architecture.md, "Tensor parallelism").
    outside = [f"{e.source} -> {e.target}" for e in EDGES if e.target.startswith("runtimes.torch_engine.tp")
               and not e.source.startswith("runtimes.torch_engine.tp") and e.source != "runtimes.torch_engine.runtime"]
    assert outside == []
    assert {m for m in MODULES if m.startswith("runtimes.torch_engine.tp.")} == {
        f"runtimes.torch_engine.tp.{m}" for m in ("comm", "executor", "launcher", "mode", "sharded_model", "worker")}


def test_the_tensor_parallel_wire_format_never_unpickles():
    # Commands between the leader and its workers are tensors only (tp/comm.py): no pickle, no
    # torch.distributed *_object collectives, no torch.load of anything a peer sent.
    forbidden = {"pickle", "marshal", "dill", "broadcast_object_list", "all_gather_object", "gather_object",
                 "scatter_object_list", "send_object_list", "recv_object_list"}
    for path in sorted((REPO / "trtllm_pipeline" / "runtimes" / "torch_engine" / "tp").glob("*.py")):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                  for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        loads = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "load"
                 and ast.unparse(n.value) == "torch"]
        assert not names & forbidden and not loads, f"{path.name}: {sorted(names & forbidden) or loads}"
