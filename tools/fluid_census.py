"""Extract the public names of Fluid 1.8 from its Python sources, statically.

Fluid's modules import Paddle's compiled core, so they cannot be imported
here; this tool reads each module's ``__all__`` with :mod:`ast` instead,
following ``__all__ = a.__all__ + [...]`` and ``__all__ += b.__all__`` into
the modules they name. A module without ``__all__`` (several Fleet modules)
contributes its top-level classes, functions and assignments not starting
with ``_``.

Regenerate the census file of the repository with::

    pip download --no-deps --python-version 3.7 --only-binary=:all: \\
        paddlepaddle==1.8.5 -d fluid-src
    unzip -q fluid-src/paddlepaddle-1.8.5-*.whl -d fluid-src/paddle
    python tools/fluid_census.py fluid-src/paddle/paddle > tests/fluid/fluid_1_8_names.json

and print the census section of ``docs/fleet.md`` (counts, refused names by
reason; pyfleet installed) with::

    python tools/fluid_census.py --report tests/fluid/fluid_1_8_names.json
"""

import ast
import json
import os
import sys

# The modules whose public names make up "the Fluid 1.8 API" (dotted, under paddle).
MODULES = [
    "fluid",
    "fluid.layers",
    "fluid.io",
    "fluid.optimizer",
    "fluid.initializer",
    "fluid.regularizer",
    "fluid.clip",
    "fluid.metrics",
    "fluid.nets",
    "fluid.contrib",
    "fluid.incubate.fleet.base.fleet_base",
    "fluid.incubate.fleet.base.role_maker",
    "fluid.incubate.fleet.collective",
    "fluid.incubate.fleet.parameter_server.distribute_transpiler",
    "fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy",
    "fluid.incubate.fleet.parameter_server.pslib",
    "fluid.incubate.fleet.utils.fleet_util",
    "fluid.incubate.fleet.utils.hdfs",
    "fluid.incubate.fleet.utils.utils",
    "reader",
    "dataset",
    "compat",
]

# Names outside every __all__ that Fleet-era scripts reach (each the first failure of
# some script): counted with the census so that they stay covered.
EXTRA = {
    "fluid": ["core", "profiler", "dygraph", "framework", "unique_name", "DatasetFactory",
              "InMemoryDataset", "QueueDataset"],
    "fluid.core": ["VarDesc", "LoDTensor", "LoDTensorArray", "CPUPlace", "Scope",
                   "EOFException"],
    "dataset": ["common"],
    "dataset.common": ["DATA_HOME", "md5file", "download", "split", "cluster_files_reader",
                       "must_mkdirs"],
}


def _path(root, module):
    base = os.path.join(root, *module.split("."))
    if os.path.isdir(base):
        return os.path.join(base, "__init__.py")
    return base + ".py"


def _imports(tree, module, is_package):
    """``local name -> dotted module`` for ``from . import x`` / ``import a.b as x``."""
    pkg = module if is_package else module.rpartition(".")[0]
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
            else:
                base = node.module.removeprefix("paddle.") if node.module else ""
                if node.module == "paddle":
                    base = ""
            if node.level and node.module:
                base = f"{base}.{node.module}" if base else node.module
            src = base
            for a in node.names:
                out[a.asname or a.name] = f"{src}.{a.name}" if src else a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name.removeprefix("paddle.")
                else:   # `import paddle.x.y` binds `paddle`: the root
                    head = a.name.split(".")[0]
                    out[head] = "" if head == "paddle" else head
    return out


def _defined(tree):
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return sorted({n for n in names if not n.startswith("_")})


def public_names(root, module, _seen=None):
    _seen = set() if _seen is None else _seen
    if module in _seen:
        return []
    _seen.add(module)
    path = _path(root, module)
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_package = path.endswith("__init__.py")
    imports = _imports(tree, module, is_package)
    pkg = module if is_package else module.rpartition(".")[0]

    def value(expr):
        if isinstance(expr, (ast.List, ast.Tuple)):
            return [e.value for e in expr.elts]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return value(expr.left) + value(expr.right)
        if isinstance(expr, ast.Attribute) and expr.attr == "__all__":
            parts, head = [], expr.value
            while isinstance(head, ast.Attribute):
                parts.insert(0, head.attr)
                head = head.value
            sub = imports.get(head.id, f"{pkg}.{head.id}")
            return public_names(root, ".".join(p for p in [sub] + parts if p), _seen)
        if isinstance(expr, ast.Name) and expr.id == "__all__":
            return []
        if isinstance(expr, ast.Name) and expr.id in lists:
            return lists[expr.id]
        raise ValueError(f"{path}: cannot evaluate __all__ expression {ast.dump(expr)}")

    names, found, lists = [], False, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and all(
                isinstance(e, ast.Constant) for e in node.value.elts):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    lists[t.id] = [e.value for e in node.value.elts]
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names, found = value(node.value), True
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and \
                node.target.id == "__all__":
            names, found = names + value(node.value), True
    if not found:
        names = _defined(tree)
    seen, ordered = set(), []
    for n in names:
        if n not in seen:
            seen.add(n)
            ordered.append(n)
    return ordered


def census(root):
    out = {}
    for m in MODULES:
        out["paddle." + m] = sorted(public_names(root, m))
    for m, extra in EXTRA.items():
        key = "paddle." + m
        out[key] = sorted(set(out.get(key, [])) | set(extra))
    return out


def resolve(module, name):
    """pyfleet's object for Fluid's ``module.name`` (``paddle.X`` is ``pyfleet.X``,
    as in zero-edit mode): an attribute, else a sub-module."""
    import importlib
    path = "pyfleet" + module[len("paddle"):]
    try:
        mod = importlib.import_module(path)
    except ModuleNotFoundError:   # a module its parent holds (fluid.initializer)
        parent, _, attr = path.rpartition(".")
        mod = getattr(importlib.import_module(parent), attr)
    try:
        return getattr(mod, name)
    except AttributeError:
        return importlib.import_module(f"{mod.__name__}.{name}")


def classify(doc):
    """``(works, refused)``: lists of ``(module, name)`` and of ``(module, name, reason)``."""
    from pyfleet.fluid import refusals
    works, refused = [], []
    for module, names in sorted(doc["modules"].items()):
        for name in names:
            obj = resolve(module, name)
            if refusals.is_refused(obj):
                refused.append((module, name, obj._fluid_reason))
            else:
                works.append((module, name))
    return works, refused


def report(path):
    """The census section of docs/fleet.md, as Markdown."""
    doc = json.load(open(path, encoding="utf-8"))
    works, refused = classify(doc)
    out = [f"Of the {len(works) + len(refused)} public names, **{len(works)} work** and "
           f"**{len(refused)} are refused** by name.", "",
           "| module | works | refused |", "|---|---|---|"]
    for module in sorted(doc["modules"]):
        w = sum(1 for m, _ in works if m == module)
        r = sum(1 for m, _, _ in refused if m == module)
        out.append(f"| `{module}` | {w} | {r} |")
    by_reason = {}
    for module, name, reason in refused:
        by_reason.setdefault(reason, []).append(f"{module.removeprefix('paddle.')}.{name}")
    out += ["", "Refused names, by reason:", ""]
    for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        out.append(f"- {reason[0].upper() + reason[1:]} ({len(names)}): "
                   + ", ".join(f"`{n}`" for n in sorted(names)))
    return "\n".join(out)


def main(argv):
    if len(argv) == 3 and argv[1] == "--report":
        print(report(argv[2]))
        return
    if len(argv) != 2:
        sys.exit("usage: python tools/fluid_census.py <unpacked wheel>/paddle | "
                 "--report <census.json>")
    names = census(argv[1])
    doc = {"source": "paddlepaddle==1.8.5 wheel, __all__ of each module (tools/fluid_census.py)",
           "modules": names}
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv)
