"""Gin bindings checked against the experiment's signature, before a run writes anything.

`check_required(fn)`: every parameter `fn` marks `gin.REQUIRED` is bound (else the shipped
configs that bind it are listed). `check_values()`: every bound value of the parsed config
fits its parameter's annotation, for the experiment's configurable and every configurable
it uses: `int`, `float` (finite), `bool`, `str`, `Literal[...]`, a union (`int | None`), a
tuple or list of those, and the intervals of `typing.Annotated[..., Range(...)]`:

    def pinn_experiment(output_dir, adam_steps: harness.Count = 2000,
                        adam_lr: harness.Positive = 1e-3, sampling: str = "sobol"): ...

refuses `adam_steps = 20.5`, `adam_steps = '20'`, `adam_lr = -1.0` and `adam_lr = '0.05'`,
naming the binding and what it must be. References (`@fn`, `@fn()`) are the referenced
function's business; a macro is checked for its value. The harness re-exports the
annotations (`harness.Count`, ...), so a binary annotates without another import.

`parse_config(gin_files, gin_params)` parses a run's config, resolving each `--gin_file` and
`include` by `resolve_gin_file` (as given, else relative to the shipped configs); the
harness re-exports both.
"""

import glob
import importlib
import inspect
import io
import math
import numbers
import os
import re
import tokenize
import types
import typing
from typing import Any, Callable, List, Optional, Sequence, Tuple

import gin
from gin import config_parser

__all__ = ["Range", "Count", "PositiveInt", "Positive", "NonNegative", "Fraction", "ConfigError",
           "check_values", "fits", "check_required", "shipped_configs", "statements", "Named",
           "check_syntax", "config_changes", "format_changes", "resolve_gin_file",
           "parse_config"]

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(PACKAGE_DIR, "configs")
# the library's packages whose configurables a config may bind (imported before parsing)
LIBRARY = ("train", "meta", "gan", "pinn", "curvature", "distribute", "optim", "implicit",
           "hypergrad")


class ConfigError(Exception):
    """A gin file or binding that cannot be used; the message names it."""


class Range(typing.NamedTuple):
    """The interval a number annotated `Annotated[int or float, Range(...)]` must lie in.

    `Range(0)` is ``[0, inf)``, `Range(0, low_open=True)` is ``(0, inf)``, `Range(0, 1)` is
    ``[0, 1]``. `check_values` refuses a bound value outside it, naming the interval.

    Attributes:
      low: the lower bound (default -inf: none).
      high: the upper bound (default inf: none).
      low_open: whether `low` itself is excluded (default False: included).
      high_open: whether `high` itself is excluded (default False: included).
    """
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False


Count = typing.Annotated[int, Range(0)]
PositiveInt = typing.Annotated[int, Range(1)]
Positive = typing.Annotated[float, Range(0, low_open=True)]
NonNegative = typing.Annotated[float, Range(0)]
Fraction = typing.Annotated[float, Range(0, 1)]


class _Text:
    """A reference or macro as it is written, so bindings compare without the registry."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class _SyntaxOnly(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name, evaluate):
        return _Text(f"@{scoped_configurable_name}{'()' if evaluate else ''}")

    def macro(self, macro_name):
        return _Text(f"%{macro_name}")


class Named(io.StringIO):
    """A config text (a file-like object) that gin's parser reports errors in under `name`.

    Args:
      text: the gin config text, read from its beginning.
      name: the file it came from (None: unnamed), set as the object's `name`, which gin's
        parser puts in a syntax error's location.
    """

    def __init__(self, text: str, name: Optional[str]) -> None:
        super().__init__(text)
        self.name = name


def statements(text: str, name: Optional[str] = None) -> list:
    """The statements of a gin config text, parsed without gin's registry.

    Args:
      text: gin config text.
      name: the file it came from, named in a syntax error (None: unnamed).

    Returns:
      A list of `gin.config_parser` statements; a reference or macro value stands as the
      text it was written as (`@maml`, `%N_WAY`).

    Raises:
      SyntaxError: the text is not gin.
    """
    return list(config_parser.ConfigParser(Named(text, name), _SyntaxOnly()))


def _describe(hint):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        r = next((m for m in args[1:] if isinstance(m, Range)), None)
        if r is None:
            return _describe(args[0])
        if r.high == math.inf:
            bound = f"{'>' if r.low_open else '>='} {r.low:g}"
        else:
            bound = (f"in {'(' if r.low_open else '['}{r.low:g}, {r.high:g}"
                     f"{')' if r.high_open else ']'}")
        return f"{_describe(args[0])} {bound}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is typing.Literal:
        return f"one of {args}"
    if origin in (tuple, list):
        return f"a tuple or list of ({', '.join(_describe(a) for a in args if a is not ...)})"
    return {int: "an integer", float: "a finite number", bool: "True or False",
            str: "a string", type(None): "None", tuple: "a tuple or list",
            list: "a tuple or list"}.get(hint, str(hint))


def fits(value: Any, hint: Any) -> bool:
    """Whether a bound value fits its parameter's annotation (what `check_values` asks).

    Args:
      value: a Python value as gin parses it.
      hint: the annotation: `int` (a bool is not one), `float` (a finite real: NaN and
        infinities are not), `bool`, `str`, `None`, `Literal[...]`, a union, a tuple or
        list of those, or `Annotated[int or float, Range(...)]` (`Count`, `Positive`, ...).
        An annotation of another kind fits anything (the function checks it).

    Returns:
      True if `value` fits `hint`.
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        ranges = [m for m in args[1:] if isinstance(m, Range)]
        return fits(value, args[0]) and all(
            (value > r.low if r.low_open else value >= r.low)
            and (value < r.high if r.high_open else value <= r.high) for r in ranges)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        items = list(args) if origin is tuple and ... not in args else [args[0]] * len(value)
        return len(items) == len(value) and all(fits(v, a) for v, a in zip(value, items))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return (isinstance(value, numbers.Real) and not isinstance(value, bool)
                and math.isfinite(value))
    if hint in (bool, str, type(None)):
        return isinstance(value, hint)
    return True  # an annotation the harness does not know: the function checks it


def _hints(selector):
    try:
        fn = inspect.unwrap(gin.get_configurable(selector))
        return typing.get_type_hints(fn.__init__ if inspect.isclass(fn) else fn,
                                     include_extras=True)
    except Exception:  # noqa: BLE001  (an unknown or unannotated configurable: unchecked)
        return {}


def check_values() -> None:
    """Check every bound value of the parsed config against its parameter's annotation.

    Reads gin's current config (`gin.config_str()`); a macro is checked for its value, a
    reference is not checked; a configurable without annotations is not checked.

    Raises:
      ConfigError: naming each binding whose value does not fit, and what it must be.
    """
    bound = [s for s in statements(gin.config_str())
             if isinstance(s, config_parser.BindingStatement)]
    macros = {s.selector: s.value for s in bound if not s.arg_name}
    wrong = []
    for s in bound:
        value = s.value
        if isinstance(value, _Text) and value.text.startswith("%"):
            value = macros.get(value.text[1:], value)
        hint = _hints(s.selector).get(s.arg_name) if s.arg_name else None
        if hint is not None and not isinstance(value, _Text) and not fits(value, hint):
            key = f"{s.scope + '/' if s.scope else ''}{s.selector}.{s.arg_name}"
            wrong.append(f"{key} = {value!r}: must be {_describe(hint)}")
    if wrong:
        raise ConfigError("bad value for the gin binding(s):\n  " + "\n  ".join(wrong))


def shipped_configs(bindings: Sequence[str]) -> list[str]:
    """The shipped configs that give any of `bindings`, themselves or through includes.

    Args:
      bindings: 'configurable.parameter' names (a scoped binding `scope/name` matches too).

    Returns:
      Paths relative to CONFIG_DIR; of the configs in subfolders (fragments such as
      maml/algorithms/maml.gin), only those nothing includes; sorted.
    """
    texts = {}
    for path in glob.glob(os.path.join(CONFIG_DIR, "**", "*.gin"), recursive=True):
        with open(path) as f:
            texts[os.path.relpath(path, CONFIG_DIR).replace(os.sep, "/")] = f.read()
    includes = {name: [re.sub(r"^configs/", "", i) for i in
                       re.findall(r"^\s*include\s+['\"]([^'\"]+)['\"]", text, re.M)]
                for name, text in texts.items()}
    binds = re.compile(rf"^\s*(?:[\w.]+/)?(?:{'|'.join(map(re.escape, bindings))})\s*=", re.M)

    def binds_it(name, seen):
        return bool(binds.search(texts.get(name, ""))) or any(
            binds_it(i, seen | {name}) for i in includes.get(name, ()) if i not in seen)

    included = {i for names in includes.values() for i in names}
    return sorted(n for n in texts if (n.count("/") <= 1 or n not in included)
                  and binds_it(n, frozenset()))


def check_required(fn: Callable) -> None:
    """Check that every parameter `fn` marks `gin.REQUIRED` is bound.

    Args:
      fn: the experiment function (a gin configurable; its bindings are `fn.__name__.param`).

    Raises:
      ConfigError: naming the missing bindings and the shipped configs that give them.
    """
    missing = []
    for param, spec in inspect.signature(inspect.unwrap(fn)).parameters.items():
        if spec.default is gin.REQUIRED:
            try:
                gin.query_parameter(f"{fn.__name__}.{param}")
            except ValueError:
                missing.append(f"{fn.__name__}.{param}")
    if missing:
        configs = shipped_configs(missing)
        listing = (f"; the shipped configs that give it (--gin_file=PATH, from any directory; "
                   f"in {CONFIG_DIR}): " + ", ".join(configs)) if configs else ""
        raise ConfigError(f"no value for the required binding(s) {', '.join(missing)}: give a "
                          f"config with --gin_file or bind it with --gin_param='{missing[0]} "
                          f"= ...'{listing}")


# Checking a binding's syntax and comparing two configs (the harness's refusal of a
# changed config), both on the text alone: gin's registry is not consulted.

def _syntax_hint(binding: str) -> str:
    """How to write the value of a binding that does not parse."""
    if "=" not in binding:
        return "a binding is 'configurable.parameter = value'"
    value = binding.split("=", 1)[1].strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?", value):
        return (f"write the number without thousands separators: {value.replace(',', '')} "
                f"(or {value.replace(',', '_')}); a comma makes a tuple only in parentheses")
    if re.fullmatch(r"[A-Za-z_][\w.]*", value):
        return (f"a string needs quotes ('{value}'), a configurable an @ (@{value}), a macro "
                f"a % (%{value})")
    return ("the value must be a Python literal (2000, 1e-3, 'text', (1, 2), [1, 2], "
            "{'a': 1}, True, None), a configurable reference (@maml) or a macro (%N_WAY)")


def check_syntax(binding: str) -> None:
    """Check that a binding (a `--gin_param`) is gin, before gin parses it.

    Args:
      binding: one binding, such as `'maml.inner_lr = 0.01'`.

    Raises:
      ConfigError: naming the binding, what is wrong (and where) and how to write it: a
        number with thousands separators, an unquoted string, a missing `=`, an unclosed
        bracket or quote.
    """
    try:
        statements(binding)
    except (SyntaxError, tokenize.TokenError) as e:
        if isinstance(e, SyntaxError):
            lines = [line.strip() for line in str(e.msg).splitlines()
                     if "object at 0x" not in line]  # Python's ast reprs say nothing
            what = " ".join(lines).rstrip(".") + (f" (column {e.offset})" if e.offset else "")
        else:
            what = "unclosed bracket or quote"
        raise ConfigError(f"bad gin binding {binding!r}: {what}; {_syntax_hint(binding)}"
                          ) from None


def config_changes(old_config: str, new_config: str
                   ) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """The bindings two gin config texts give differently.

    Args:
      old_config: a config text (such as a run's config.gin).
      new_config: another.

    Returns:
      `[(binding, old value, new value)]`, sorted by binding (`scope/configurable.param`,
      or a macro's name), the values as written (`repr`); None for a side that does not
      bind it.

    Raises:
      SyntaxError: a text is not gin (an unclosed bracket or quote too).
    """
    def bound(text):
        try:
            parsed = statements(text)
        except tokenize.TokenError as e:
            raise SyntaxError(f"{e.args[0]}: an unclosed bracket or quote") from None
        return {(f"{s.scope}/" if s.scope else "") + s.selector
                + (f".{s.arg_name}" if s.arg_name else ""): repr(s.value)
                for s in parsed if isinstance(s, config_parser.BindingStatement)}
    old, new = bound(old_config), bound(new_config)
    return [(k, old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)]


def format_changes(changes: Sequence[Tuple[str, Optional[str], Optional[str]]]) -> str:
    """`config_changes`'s list as lines `  binding: old -> new`.

    Args:
      changes: `(binding, old value, new value)` triples; None for an unbound side.

    Returns:
      one line per change, indented by two spaces; an unbound side reads
      `(not bound: the default)`.
    """
    unset = "(not bound: the default)"
    return "\n".join(f"  {k}: {unset if a is None else a} -> {unset if b is None else b}"
                     for k, a, b in changes)


def resolve_gin_file(path: str) -> str:
    """The file a `--gin_file` or an `include` names.

    Args:
      path: as given, else relative to the shipped configs (`maml/sinusoid_maml.gin` or
        the repository's form `configs/maml/...`).

    Returns:
      The path of an existing file.

    Raises:
      ConfigError: no such file (naming the directories looked in).
    """
    roots = [""] if os.path.isabs(path) else ["", CONFIG_DIR, PACKAGE_DIR]
    for candidate in (os.path.join(root, path) for root in roots):
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f"gin file not found: {path} (looked in the working directory "
                      f"{os.getcwd()} and in the shipped configs {CONFIG_DIR})")


def _nonfinite(value):
    """Whether a parsed binding value holds a NaN or an infinity (at any depth)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (tuple, list)):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in (*value.keys(), *value.values()))
    return False


def _check_finite(parsed, where):
    """Refuse a binding whose value holds a non-finite number (`1e999`): gin leaves such a
    binding out of its config text, so neither `check_values` nor config.gin would see it."""
    for s in parsed:
        if isinstance(s, config_parser.BindingStatement) and _nonfinite(s.value):
            key = ((f"{s.scope}/" if s.scope else "") + s.selector
                   + (f".{s.arg_name}" if s.arg_name else ""))
            line = f", line {s.location.line_num}" if where else ""
            raise ConfigError(f"bad value for the gin binding {key} = {s.value!r}{where}{line}: "
                              "must hold finite numbers only (gin cannot write this one to "
                              "config.gin)")


def _parse_file(path, including=()):
    """Parse a gin file, resolving its includes here (gin's own search would first ask its
    package reader, which logs an error for every include it cannot import as a package)."""
    if path in including:
        raise ConfigError(f"{path} includes itself (through {' -> '.join(including)})")
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    try:
        parsed = statements("".join(lines), path)
    except tokenize.TokenError:  # not a SyntaxError: gin's message would not name the file
        raise ConfigError(f"bad gin config: {path} ends inside an unclosed bracket or quote"
                          ) from None
    _check_finite(parsed, f" in {path}")
    start = 0  # the first line not parsed yet; the blank lines before it keep line numbers
    for statement in parsed:
        if isinstance(statement, config_parser.IncludeStatement):
            end = statement.location.line_num - 1
            gin.parse_config(Named("\n" * start + "".join(lines[start:end]), path))
            try:
                included = resolve_gin_file(statement.filename)
            except ConfigError as e:
                raise ConfigError(f"{e}; included in {path}, line {end + 1}") from None
            _parse_file(included, including + (path,))
            start = end + 1
    gin.parse_config(Named("\n" * start + "".join(lines[start:]), path))


def parse_config(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
    """Clear any previous config, then parse gin files and then bindings.

    Args:
      gin_files: paths (see `resolve_gin_file`), later ones overriding.
      gin_params: binding strings, parsed last.

    Raises:
      ConfigError: naming the binding (with a hint for a malformed value, or a value
        holding a NaN or an infinity, which gin cannot write to config.gin), or the
        configurable or parameter and, for files, the file and line.
    """
    for name in LIBRARY:  # register every library configurable before parsing
        importlib.import_module(f"hogrod.{name}")
    files = [resolve_gin_file(p) for p in gin_files]
    for binding in gin_params:
        check_syntax(binding)
        _check_finite(statements(binding), "")
    try:
        with gin.unlock_config():  # a previous run in this process may have locked it
            gin.clear_config()
            for path in files:
                _parse_file(path)
            gin.parse_config(list(gin_params))
    except (ValueError, KeyError, TypeError, IOError, SyntaxError) as e:
        raise ConfigError(f"bad gin config: {e}") from None
