"""The Python wing's module rule (docs/python.md, "Module layout"): importing each module of
accumplan alone works; no module imports a private name (a leading underscore) of another, or
reads one through a module it imported; the import graph among the package's modules has no
cycle, neither at module level nor counting the imports made inside functions.

Modules whose own name starts with an underscore (_core, _args, _probes) are the package's
internal modules: siblings import them; the names inside them follow the same rule."""

import ast
import os
import subprocess
import sys
import unittest

import accumplan

PACKAGE_DIR = os.path.dirname(accumplan.__file__)
PACKAGE = "accumplan"


def _modules():
    """Every Python module of the installed package: name -> parsed tree."""
    found = {}
    for name in sorted(os.listdir(PACKAGE_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE_DIR, name), encoding="utf-8") as f:
                found[name[:-3]] = ast.parse(f.read(), name)
    return found


def _target(node, module_names):
    """The package module an ImportFrom / Import names, or None for one outside the package."""
    if isinstance(node, ast.ImportFrom):
        if node.level == 0 and (node.module or "").split(".")[0] != PACKAGE:
            return None
        dotted = (node.module or "") if node.level else ".".join((node.module or "").split(".")[1:])
        return dotted or "__init__"
    return None


def _imports(tree, module_names, top_level_only):
    """(edges, private_uses) of one module: edges to the package's modules it imports; each
    private name it takes from one (``from .x import _y``, or ``x._y`` on a module it bound)."""
    edges, private, bound = set(), [], {}
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # statements at module level, also inside a top-level try/if
        stack, nodes = list(tree.body), []
        while stack:
            n = stack.pop()
            nodes.append(n)
            if isinstance(n, (ast.Try, ast.If)):
                stack.extend(n.body + n.orelse + getattr(n, "finalbody", []) +
                             [s for h in getattr(n, "handlers", []) for s in h.body])
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in module_names:
                    edges.add(parts[1])
                    if alias.asname:
                        bound[alias.asname] = parts[1]
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        target = _target(node, module_names)
        if target is None:
            continue
        for alias in node.names:
            if target == "__init__" and alias.name in module_names:  # from . import x: the module x
                edges.add(alias.name)
                bound[alias.asname or alias.name] = alias.name
                continue
            edges.add(target)
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                private.append("from %s import %s" % (target, alias.name))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            private.append("%s.%s" % (bound[node.value.id], node.attr))
    return edges, private


def _cycle(graph):
    """One cycle of the graph as a list of modules, or None."""
    state = {}

    def visit(n, path):
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m, path + [m])
                if found:
                    return found
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n, [n])
            if found:
                return found
    return None


class PackageStructure(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trees = _modules()
        cls.names = set(cls.trees) | {"_core", "_probes"}  # the compiled modules

    def test_the_package_has_the_modules_the_layout_names(self):
        for name in ("train", "window", "losses", "batches", "distributed", "errors", "plans", "measure"):
            self.assertIn(name, self.trees)

    def test_each_module_imports_alone_in_a_fresh_interpreter(self):
        for name in sorted(self.trees):
            module = PACKAGE if name == "__init__" else "%s.%s" % (PACKAGE, name)
            with self.subTest(module=module):
                run = subprocess.run([sys.executable, "-c", "import %s" % module], cwd=os.path.dirname(PACKAGE_DIR),
                                     capture_output=True, text=True, timeout=300)
                self.assertEqual(run.returncode, 0, run.stderr[-2000:])

    def test_no_module_takes_a_private_name_of_another(self):
        for name, tree in self.trees.items():
            with self.subTest(module=name):
                _, private = _imports(tree, self.names, top_level_only=False)
                self.assertEqual(private, [], "%s uses private names of other modules" % name)

    def test_the_module_level_import_graph_has_no_cycle(self):
        graph = {n: _imports(t, self.names, top_level_only=True)[0] - {n} for n, t in self.trees.items()}
        self.assertIsNone(_cycle(graph))
        self.assertNotIn("plans", graph["train"])  # plans may import train lazily (Plan.train_window)

    def test_the_import_graph_with_lazy_imports_has_no_cycle(self):
        graph = {n: _imports(t, self.names, top_level_only=False)[0] - {n} for n, t in self.trees.items()}
        # The package's __init__ is imported first by every module; its lazy imports are its API.
        graph = {n: e - {"__init__"} for n, e in graph.items()}
        self.assertIsNone(_cycle(graph))

    def test_the_checker_finds_a_private_import_and_a_cycle(self):
        bad = ast.parse("from .train import _Window\nfrom . import plans\nplans._set(1)\n")
        _, private = _imports(bad, self.names, top_level_only=False)
        self.assertEqual(private, ["from train import _Window", "plans._set"])
        self.assertEqual(_cycle({"a": {"b"}, "b": {"a"}}), ["a", "b", "a"])


if __name__ == "__main__":
    unittest.main()
