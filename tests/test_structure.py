"""The library's shape, read from its source: the families import the modules they use.

`hogrod/__init__.py` re-exports the primitives for users; inside the library a module names
the module it depends on (`from hogrod import autodiff`, then `autodiff.grad`), so the
layers of WORKSPACE.md stay visible in the imports and no module depends on the package's
top level being imported first."""

import ast
import glob
import importlib.util
import os

from hogrod import harness

_LIBRARY = os.path.join(harness.REPO_ROOT, "hogrod")


def _modules():
    """Every module of the library but its top-level `__init__`, as repository paths."""
    paths = glob.glob(os.path.join(_LIBRARY, "**", "*.py"), recursive=True)
    return sorted(os.path.relpath(p, harness.REPO_ROOT).replace(os.sep, "/") for p in paths
                  if os.path.relpath(p, _LIBRARY) != "__init__.py")


def _is_module(name):
    return importlib.util.find_spec(name) is not None


def _top_level_uses(source):
    """Where a source uses the package's top level: `import hogrod` (or `import hogrod.x`,
    which binds `hogrod` too), `hogrod.<name>` in code, and `from hogrod import <name>` of a
    name that is not a module (a re-exported primitive)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "hogrod" and a.asname is None]
        elif isinstance(node, ast.ImportFrom) and node.module == "hogrod" and not node.level:
            found += [f"line {node.lineno}: from hogrod import {a.name}" for a in node.names
                      if not _is_module(f"hogrod.{a.name}")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "hogrod"):
            found.append(f"line {node.lineno}: hogrod.{node.attr}")
    return found


def test_the_check_finds_each_way_of_reaching_the_top_level():
    source = ("import hogrod\nimport hogrod.tree\nfrom hogrod import grad, autodiff\n"
              "import hogrod.tree as t\nfrom hogrod.autodiff import hvp\n"
              "x = hogrod.hvp(f, p, v)\n'''`hogrod.grad` in a docstring'''\n")
    assert _top_level_uses(source) == ["line 1: import hogrod", "line 2: import hogrod.tree",
                                       "line 3: from hogrod import grad",
                                       "line 6: hogrod.hvp"]


def test_no_library_module_reaches_the_package_top_level():
    found = {}
    for path in _modules():
        with open(os.path.join(harness.REPO_ROOT, path)) as f:
            uses = _top_level_uses(f.read())
        if uses:
            found[path] = uses
    assert len(_modules()) > 60 and "hogrod/meta/imaml.py" in _modules()
    assert found == {}, found


def _required_defaults(source):
    """Parameters whose default is `gin.REQUIRED`, as `line N: function(parameter)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d]
            found += [f"line {node.lineno}: {node.name}({a.arg})" for a, d in pairs
                      if ast.unparse(d) == "gin.REQUIRED"]
    return found


def test_no_library_function_has_a_gin_required_default():
    """Library functions take arguments and gin binds them: a parameter a caller must give
    has no default (a missing binding is then named by gin's error), never `gin.REQUIRED`,
    which means nothing to a caller outside gin. The binaries' own signatures
    (experiments/) may use it: the harness checks those before a run."""
    assert _required_defaults("def f(a, b=gin.REQUIRED, *, c=1, d=gin.REQUIRED): pass\n") == [
        "line 1: f(b)", "line 1: f(d)"]
    found = {}
    for path in _modules():
        with open(os.path.join(harness.REPO_ROOT, path)) as f:
            required = _required_defaults(f.read())
        if required:
            found[path] = required
    assert found == {}, found


_MODULE_LINES = 500
_BODY_LINES = 100


def _sizes(path, source):
    """`path: N lines` past the module limit and `path: fn() body N lines` past the body
    limit (the body without its docstring)."""
    found = []
    lines = source.count("\n")
    if lines > _MODULE_LINES:
        found.append(f"{path}: {lines} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (len(body) > 1 and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                body = body[1:]
            length = node.end_lineno - body[0].lineno + 1
            if length > _BODY_LINES:
                found.append(f"{path}: {node.name}() body {length} lines")
    return found


def test_modules_and_function_bodies_stay_short():
    """Every module of the library and the experiments under 500 lines, every function
    body (docstring aside) under 100."""
    body = "\n".join(f"    x{i} = {i}" for i in range(_BODY_LINES + 1))
    assert _sizes("m.py", f'def f():\n    """Doc."""\n{body}\n') == ["m.py: f() body 101 lines"]
    paths = _modules() + sorted(
        os.path.relpath(p, harness.REPO_ROOT).replace(os.sep, "/") for p in
        glob.glob(os.path.join(harness.REPO_ROOT, "experiments", "**", "*.py"), recursive=True))
    found = []
    for path in paths:
        with open(os.path.join(harness.REPO_ROOT, path)) as f:
            found += _sizes(path, f.read())
    assert found == [], found


def _readme():
    with open(os.path.join(harness.REPO_ROOT, "README.md")) as f:
        return f.read()


def test_the_readme_lists_every_console_command_and_every_binary():
    """README's command list is pyproject's [project.scripts], and its family table names
    every binary (experiments/*.py) and every shipped config folder's family."""
    import re
    import tomllib
    with open(os.path.join(harness.REPO_ROOT, "pyproject.toml"), "rb") as f:
        scripts = set(tomllib.load(f)["project"]["scripts"])
    text = _readme()
    # the list in parentheses after "the console command `hogrod-NAME`"
    listed = re.search(r"console command `hogrod-NAME` \(([^)]*)\)", text)
    listed = set(re.findall(r"`(hogrod-[a-z-]+)`", listed.group(1) if listed else ""))
    assert listed == scripts, (f"README lists {sorted(listed - scripts)} that pyproject does "
                               f"not define and omits {sorted(scripts - listed)}")
    binaries = {os.path.basename(p) for p in
                glob.glob(os.path.join(harness.REPO_ROOT, "experiments", "*.py"))} - {
        "__init__.py"}
    table = text[text.index("## The families"):text.index("Every experiment is")]
    assert [b for b in sorted(binaries) if f"`experiments/{b}`" not in table
            and f"`{b}`" not in table] == []
    assert "library only" not in table
