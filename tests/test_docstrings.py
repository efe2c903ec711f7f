"""Every exported name is specified: Google-style Args and Returns, annotations, a reference.

Oracles: the signatures themselves (`inspect`), parsed docstrings (`docstring_parser`, the
parser napoleon-style docstrings are written for), ruff's docstring rules (the linter,
Google style) and Sphinx's autodoc with napoleon building the API reference with warnings as
errors.
"""

import dataclasses
import importlib
import inspect
import subprocess
import sys
import typing
from pathlib import Path

import docstring_parser
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Every public module: a package's `__init__` and the top-level modules a user imports.
PUBLIC = ["hogrod", "hogrod.tree", "hogrod.linalg", "hogrod.checks", "hogrod.implicit",
          "hogrod.hypergrad", "hogrod.distribute", "hogrod.models", "hogrod.data",
          "hogrod.bindings", "hogrod.harness", "hogrod.train", "hogrod.optim", "hogrod.meta",
          "hogrod.gan", "hogrod.pinn", "hogrod.curvature", "hogrod.rl",
          "hogrod.second_order", "hogrod.learned"]


def _exported():
    seen = {}
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isfunction(obj) or inspect.isclass(obj) or hasattr(obj, "__wrapped__"):
                seen.setdefault(id(obj), (f"{name}.{attr}", obj))
    return sorted(seen.values(), key=lambda item: item[0])


def _own(obj):
    return getattr(obj, "__module__", "").startswith("hogrod")


def _record_like(cls):
    return dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


def _documented(doc):
    names = set()
    # docstring_parser >= 0.17 keeps an Attributes section apart from Args (`attrs`)
    for p in list(doc.params) + list(getattr(doc, "attrs", None) or []):
        names.add(p.arg_name.lstrip("*"))
        # "x, y: ..." documents two arguments in one entry
        names.update(part.strip().lstrip("*") for part in p.arg_name.split(","))
    return names


def _check_callable(where, fn, doc_owner=None, skip_first=False):
    """Problems with `fn`'s annotations and its docstring's Args and Returns."""
    problems = []
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return problems
    params = list(sig.parameters.values())
    if skip_first and params:
        params = params[1:]
    text = inspect.getdoc(doc_owner or fn) or ""
    if not text.strip():
        return [f"{where}: no docstring"]
    doc = docstring_parser.parse(text, docstring_parser.DocstringStyle.GOOGLE)
    documented = _documented(doc)
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            problems.append(f"{where}: argument `{p.name}` has no type annotation")
        if p.name not in documented:
            problems.append(f"{where}: argument `{p.name}` is not in Args")
    for name in documented - {p.name for p in params}:
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            problems.append(f"{where}: Args documents `{name}`, not in the signature")
    if doc_owner is None:
        ret = sig.return_annotation
        if ret is inspect.Signature.empty:
            problems.append(f"{where}: no return annotation")
        elif ret is not None and ret is not type(None) and ret != "None":
            if doc.returns is None and not doc.many_returns and doc.yields is None:
                problems.append(f"{where}: no Returns (or Yields) section")
    return problems


def _check_class(where, cls):
    text = inspect.getdoc(cls) or ""
    if not text.strip() or text == inspect.getdoc(object):
        return [f"{where}: no docstring"]
    problems = []
    doc = docstring_parser.parse(text, docstring_parser.DocstringStyle.GOOGLE)
    if _record_like(cls):
        fields = (cls._fields if hasattr(cls, "_fields")
                  else [f.name for f in dataclasses.fields(cls)])
        # docstring_parser 0.18 keeps `Attributes:` entries out of `doc.params`
        attributes = {part.strip() for m in doc.meta if m.args[:1] == ["attribute"]
                      for part in m.args[-1].split(",")}
        missing = set(fields) - _documented(doc) - attributes
        problems += [f"{where}: field `{f}` is not in Attributes" for f in sorted(missing)]
    elif issubclass(cls, BaseException):
        pass  # an error: its message is its interface
    elif "__init__" in cls.__dict__:
        init = cls.__dict__["__init__"]
        own_doc = init.__doc__ and "Args:" in init.__doc__
        problems += _check_callable(where, init, doc_owner=None if own_doc else cls,
                                    skip_first=True)
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            if not (member.__doc__ or "").strip():
                problems.append(f"{where}.{name}: property without a docstring")
            continue
        if isinstance(member, (staticmethod, classmethod)):
            fn, skip = member.__func__, isinstance(member, classmethod)
        elif inspect.isfunction(member):
            fn, skip = member, True
        else:
            continue
        if _own(fn):
            problems += _check_callable(f"{where}.{name}", fn, skip_first=skip)
    return problems


def _all_problems():
    problems = []
    for where, obj in _exported():
        if not _own(obj):
            continue
        if inspect.isclass(obj):
            problems += _check_class(where, obj)
        else:
            problems += _check_callable(where, obj)
    return problems


def test_every_exported_name_has_args_returns_and_annotations():
    problems = _all_problems()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_the_check_catches_a_missing_argument_and_annotation():
    def documented(x: int, y: int) -> int:
        """Adds.

        Args:
            x: one.

        Returns:
            The sum.
        """
        return x + y

    def unannotated(x):
        """Nothing.

        Args:
            x: one.
        """

    assert _check_callable("f", documented) == ["f: argument `y` is not in Args"]
    assert _check_callable("g", unannotated) == ["g: argument `x` has no type annotation",
                                                 "g: no return annotation"]


def test_the_docstring_linter_finds_no_mismatched_args_or_returns():
    """ruff's docstring rules (pyproject.toml's [tool.ruff.lint]) on all of
    hogrod/, private helpers included."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "hogrod"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_api_reference_builds_without_warnings(tmp_path):
    from sphinx.cmd.build import build_main
    log = tmp_path / "warnings.txt"
    code = build_main(["-b", "dummy", "-W", "--keep-going", "-q", "-E", "-w", str(log),
                       str(ROOT / "docs" / "api"), str(tmp_path / "out")])
    assert code == 0, log.read_text()[-6000:]
