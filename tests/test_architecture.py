"""The package's layers, read from the source with ``ast`` (docs/architecture.md draws them).

Every module of ``pyfleet`` belongs to one room; a room may import only from
rooms below it, never from a sibling room of the same level (the service and
Fluid know nothing of each other), and module-level imports form no circle.
A new module must be given a room here: the test names it otherwise. Python
modules and classes, C++ files and functions have a size limit.
"""

import ast
import json
import re
import subprocess
import sys

import pytest
from support import REPO

PACKAGE = REPO / "pyfleet"

# (room, level, module prefixes). Longest prefix wins. Facades and the thin
# re-exports of old import paths sit on top: nothing below may import them.
ROOMS = [
    ("base", 0, ["pyfleet._core", "pyfleet._version", "pyfleet.errors", "pyfleet._atomic",
                 "pyfleet._extras", "pyfleet._malloc",
                 "pyfleet.endpoint", "pyfleet._record", "pyfleet.compat"]),
    ("table", 1, ["pyfleet.entry", "pyfleet.initializer", "pyfleet.optimizer", "pyfleet.table",
                  "pyfleet.metrics"]),
    ("data", 1, ["pyfleet.data", "pyfleet.reader"]),
    ("config", 2, ["pyfleet.config", "pyfleet._transpiler_flags", "pyfleet.ps_dispatcher"]),
    ("service", 3, ["pyfleet.service"]),
    ("fluid", 3, ["pyfleet.fluid", "pyfleet.dataset"]),
    ("distributed", 4, ["pyfleet.distributed", "pyfleet.models"]),
    ("serving", 4, ["pyfleet.serving"]),
    ("fluid facade", 5, ["pyfleet.fluid.__init__", "pyfleet.fluid.incubate.fleet",
                         "pyfleet.fluid.transpiler"]),
    ("app", 6, ["pyfleet.trainer", "pyfleet.launch", "pyfleet.cli", "pyfleet.as_paddle"]),
    ("facade", 7, ["pyfleet.__init__"]),
]
# Old import paths kept for users and docs: thin re-exports of a module's new home.
COMPAT = ["pyfleet.role_maker", "pyfleet.server", "pyfleet.client", "pyfleet.protocol",
          "pyfleet.auth", "pyfleet.inference", "pyfleet._fleet", "pyfleet._checkpoint",
          "pyfleet._prefetch"]

MAX_MODULE_LINES = 550
MAX_CLASS_LINES = 420
# The C++ core: a file holds one path of a table (sparse_table_pull.cc, ...),
# a function one step of it (PushShard's steps, EvictLocked's, the
# bindings' Bind* functions).
MAX_CXX_FILE_LINES = 700
MAX_CXX_FUNCTION_LINES = 80
CXX_FILES = sorted([*(REPO / "src").glob("*.cc"), *(REPO / "src").glob("*.h"),
                    *(REPO / "include").rglob("*.h")])


def _modules():
    """``{dotted name: path}`` of every module in the package (a package as ``pkg.__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        out[".".join(rel.parts)] = path
    return out


MODULES = _modules()
COMPILED = {"pyfleet._core": "src/bindings", "pyfleet.data._parse": "pyfleet/data/_parse.pyx"}


def _resolve(name):
    """The module a dotted import name loads: itself, or its package's ``__init__``."""
    if name in MODULES or name in COMPILED:
        return name
    if name + ".__init__" in MODULES:
        return name + ".__init__"
    return None


def _room(module):
    """``(room, level)`` of ``module``: a compat shim, or the longest matching room prefix."""
    if module in COMPAT:
        return ("compat", 8)
    best = None
    for room, level, prefixes in ROOMS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (
                    best is None or len(p) > best[2]):
                best = (room, level, len(p))
    if best is None:
        raise AssertionError(f"{module} belongs to no room: add it to ROOMS in {__file__}")
    return best[:2]


def _package_of(module):
    parts = module.split(".")
    return ".".join(parts[:-1])


def _imports(module, path):
    """``[(imported module, line, at module level)]`` of one file's pyfleet imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(n) for n in tree.body}
    for n in tree.body:  # imports under a module-level `if`/`try` still run at import
        if isinstance(n, (ast.If, ast.Try)):
            top_level.update(id(c) for c in ast.walk(n))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = _package_of(module).split(".")
                if module.endswith(".__init__"):
                    pkg = module.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                names.append(sub if _resolve(sub) else base)
        for name in names:
            if not name.startswith("pyfleet"):
                continue
            target = _resolve(name)
            if target is None:
                continue  # a compiled module (_core, _parse) or a missing one: import fails anyway
            found.append((target, node.lineno, id(node) in top_level))
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}
GRAPH.update({m: [] for m in COMPILED})


def test_every_module_has_a_room():
    for module in MODULES:
        _room(module)


def test_no_module_imports_a_higher_or_sibling_room():
    bad = []
    for module, imports in GRAPH.items():
        room, level = _room(module)
        for target, line, _ in imports:
            t_room, t_level = _room(target)
            if t_room == room:
                continue
            if t_level > level or (t_level == level and t_room != room):
                bad.append(f"{MODULES[module].relative_to(REPO)}:{line} ({room}) imports "
                           f"{target} ({t_room})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_imports_have_no_circle():
    """No circle, counting imports inside functions too: a function-level import that
    closes a circle only hides it until the function runs."""
    edges = {m: sorted({t for t, _, _ in imps if t != m and not _is_parent_package(t, m)})
             for m, imps in GRAPH.items()}
    # A package's __init__ runs before any of its submodules: importing a submodule
    # depends on the package. Facades re-export everything below them, so they
    # are roots, not parts of a cycle (nothing below imports them: checked above).
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in edges.get(m, ()):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _is_parent_package(target, module):
    """``pkg.__init__`` of ``pkg.sub``: importing a submodule runs its package first,
    so a package's ``__init__`` re-exporting its submodules is no circle."""
    return target.endswith(".__init__") and module.startswith(target[:-len("__init__")])


# Readers have one home, pyfleet.data (CTR files, MultiSlot text, paddle.reader's
# decorators and batch); the modules Paddle's paths name are faces over it.
READER_FACES = ["pyfleet.reader.__init__"]


def test_readers_live_in_data_and_the_old_paths_are_faces_over_it():
    import pyfleet.fluid.dataset
    import pyfleet.fluid.io
    import pyfleet.fluid.reader
    import pyfleet.reader
    from pyfleet.data import multislot, reader_decorators
    for name in pyfleet.reader.__all__:
        assert getattr(pyfleet.reader, name) is getattr(reader_decorators, name), name
    assert pyfleet.fluid.reader.batch is pyfleet.fluid.io.batch is reader_decorators.batch
    assert pyfleet.fluid.dataset.parse_multislot is multislot.parse_multislot
    for module in READER_FACES:
        tree = ast.parse(MODULES[module].read_text())
        code = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom,
                                                           ast.Expr, ast.Assign))]
        assert not code, f"{module} should only re-export pyfleet.data, has {code[0].__class__}"


def test_old_import_paths_warn_naming_their_new_home():
    """Each old path still imports, with a DeprecationWarning that names it (read in a
    fresh interpreter: a module warns when it is first imported)."""
    old = [m for m in COMPAT if m in MODULES]
    code = ("import importlib, json, warnings\n"
            "out = {}\n"
            f"for m in {old!r}:\n"
            "    with warnings.catch_warnings(record=True) as seen:\n"
            "        warnings.simplefilter('always')\n"
            "        importlib.import_module(m)\n"
            "    out[m] = [str(w.message) for w in seen\n"
            "              if issubclass(w.category, DeprecationWarning)]\n"
            "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=False, cwd=REPO)
    assert r.returncode == 0, r.stderr
    said = json.loads(r.stdout.strip().splitlines()[-1])
    for module in old:
        assert any(module in text and "import" in text for text in said[module]), \
            (module, said[module])


def test_compat_modules_are_thin():
    for module in COMPAT:
        path = MODULES.get(module)
        if path is None:
            continue
        tree = ast.parse(path.read_text())
        code = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr,
                                                           ast.Assign, ast.If))]
        assert not code, f"{module} should only re-export its new home, has {code[0].__class__}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_and_class_sizes(module):
    path = MODULES[module]
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)} has {lines} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_CLASS_LINES, (
                f"{path.relative_to(REPO)}: class {node.name} has {size} lines")


def _cxx_functions(text):
    """``[(name, first line, lines)]`` of the functions a C++ file defines at column 0.

    The project's format puts a definition's first line and its closing brace
    at column 0 (clang-format's Google style): a definition runs from a line
    at column 0 that opens a parameter list, through the line its body's
    ``{`` ends, to the next ``}`` at column 0. Declarations (ending in ``;``),
    types and preprocessor lines are not functions.
    """
    lines = [re.sub(r"\s*//.*$", "", line) for line in text.split("\n")]  # comments off
    found, i = [], 0
    skip = ("#", "//", "}", "namespace", "using", "static_assert", "struct", "class", "enum")
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and "(" in line and not line.startswith(skip):
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and "= {" not in lines[j]:
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
                m = re.search(r"([A-Za-z_][\w:]*)\s*\(", line)
                found.append((m.group(1) if m else line, i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return found


def test_cxx_function_finder_sees_definitions_not_declarations():
    text = ("void Declared(int a);  // elsewhere\n"
            "size_t Table::Pull(const uint64_t* keys,\n"
            "                   size_t n) {\n"
            "  if (n) {\n"
            "  }\n"
            "}\n"
            "PYBIND11_MODULE(_core, m) {\n"
            "  m.doc() = \"x\";\n"
            "}\n")
    assert _cxx_functions(text) == [("Table::Pull", 2, 5), ("PYBIND11_MODULE", 7, 3)]


@pytest.mark.parametrize("path", CXX_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_cxx_file_and_function_sizes(path):
    text = path.read_text()
    lines = text.count("\n")
    assert lines <= MAX_CXX_FILE_LINES, f"{path.relative_to(REPO)} has {lines} lines"
    for name, first, size in _cxx_functions(text):
        assert size <= MAX_CXX_FUNCTION_LINES, (
            f"{path.relative_to(REPO)}:{first}: {name} has {size} lines")
