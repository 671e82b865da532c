"""Finding the implementation under test (`--impl`) and checking its API up front.

NAME is one of

* ``reference`` (module ``reference.speculative``), ``reference-head`` (module
  ``reference.heads.kit``: the reference drafting with an EAGLE-3 head of the target, chains
  and dynamic trees), ``fast`` (module ``fast``), ``fast-eager``
  (module ``fast.eager``: the fast engine without its fused CPU step), ``fast-head`` (module
  ``fast.head_kit``, object ``EAGLE3``: the fast engine drafting with an EAGLE-3 head of the
  target) or ``fast-mtp`` (``fast.head_kit``, object ``MTP``: the same with an MTP layer);
* a dotted module name, e.g. ``mypkg.spec``;
* a path to a ``.py`` file, e.g. ``engine/speculative.py``;
* any of those followed by ``:ATTR``, where ATTR names an attribute of the module: a class
  (instantiated with no arguments) or an object whose attributes provide the functions,
  e.g. ``tests/mutants/catalogue.py:InvertedRatio``.

The functions are grouped in levels; an implementation may expose any of them:

    rule     accept_or_correct(p, q, token, generator=None) -> (token, accepted)
    engine   speculative_generate(target, draft, prompt_ids, max_new_tokens, k=4,
                                  temperature=0.0, stop_ids=(), generator=None) -> (tokens, stats)
             (keywords top_k= and top_p= are exercised when the function names them)
    batched  batched_generate(target, draft, prompts, max_new_tokens, k=4, temperature=0.0,
                              stop_ids=(), generator=None, *, top_k=0, top_p=1.0)
    tree     tree_generate(target, draft, prompt_ids, max_new_tokens, tree=(2, 2, 2),
                           stop_ids=())
             (keywords temperature=, generator=, top_k=, top_p= are exercised when named)

An optional attribute ``KIT_MODEL_KINDS`` (a subset of {"qwen3", "table"}) says which of the
kit's models the implementation can run; by default both.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ALIASES = {"reference": "reference.speculative", "fast": "fast",
           # the reference drafting with an EAGLE-3 head of the target (reference/heads/kit.py)
           "reference-head": "reference.heads.kit",
           # the fast engine with its steps run as torch operations, not one fused CPU call
           "fast-eager": "fast.eager",
           # the fast engine drafting with an EAGLE-3 head / an MTP layer of the target
           # (fast/head_kit.py)
           "fast-head": "fast.head_kit:EAGLE3",
           "fast-mtp": "fast.head_kit:MTP",
           # transformers' assisted generation and prompt lookup (properties/adapters/transformers.py)
           "transformers": "properties.adapters.transformers",
           "transformers-lookup": "properties.adapters.transformers:PromptLookup",
           # its other paths (properties/adapters/transformers_paths.py, issue 40)
           "transformers-early-exit": "properties.adapters.transformers_paths:EarlyExitImpl",
           "transformers-universal": "properties.adapters.transformers_paths:UniversalImpl",
           "transformers-ensemble": "properties.adapters.transformers_paths:EnsembleImpl"}
# --impl=SCHEME:REST -> "module:function" that builds its Impl from the whole spec. A lookup
# by name, so that this module imports no adapter: the adapters import Impl from here.
SCHEMES = {"openai": "properties.adapters.served:make_impl"}
MODEL_KINDS = frozenset({"qwen3", "table"})


class ImplError(Exception):
    """The implementation cannot be used: the message says why, naming it."""


@dataclass(frozen=True)
class Signature:
    function: str
    required: tuple[str, ...]          # positional, in this order, named like this
    optional: tuple[str, ...]          # passed by keyword, must be accepted
    extra: tuple[str, ...] = ()        # exercised only when the function names them

    def call_text(self) -> str:
        args = list(self.required) + [f"{name}=..." for name in self.optional]
        return f"{self.function}({', '.join(args)})"


LEVELS: dict[str, tuple[Signature, ...]] = {
    "rule": (Signature("accept_or_correct", ("p", "q", "token"), ("generator",)),),
    "engine": (Signature("speculative_generate", ("target", "draft", "prompt_ids", "max_new_tokens"),
                         ("k", "temperature", "stop_ids", "generator"), ("top_k", "top_p")),),
    "batched": (Signature("batched_generate", ("target", "draft", "prompts", "max_new_tokens"),
                          ("k", "temperature", "stop_ids", "generator"),
                          ("top_k", "top_p", "cuda_graphs")),),
    "tree": (Signature("tree_generate", ("target", "draft", "prompt_ids", "max_new_tokens"),
                       ("tree", "stop_ids"),
                       ("temperature", "generator", "top_k", "top_p", "cuda_graphs")),),
}


# Optional: the engine's own sampler without speculation (issue 15), for engines whose sampler
# may define temperature / top-k / top-p differently from the convention (reference.sampling).
OWN_SAMPLER = Signature("target_generate", ("target", "prompt_ids", "max_new_tokens"),
                        ("temperature", "stop_ids", "generator"), ("top_k", "top_p"))


class Impl:
    """The implementation under test: its functions by name, grouped in levels."""

    def __init__(self, spec: str, description: str):
        self.spec = spec                    # what --impl said
        self.description = description      # where it came from
        self.functions: dict[str, object] = {}
        self.keywords: dict[str, frozenset] = {}   # function -> the extra keywords it names
        self.levels: tuple[str, ...] = ()
        self.missing: dict[str, tuple[str, ...]] = {}  # level -> missing function names
        self.hints: dict[str, str] = {}     # missing function -> a similar name it does have
        self.model_kinds: frozenset = MODEL_KINDS
        # Greedy divergences where the float64 target's top-two logit gap is below this are
        # ties (KIT_LOGIT_TOLERANCE: an engine computing its own logits in lower precision).
        self.logit_tolerance: float | None = None
        # family -> why it does not apply (KIT_NOT_APPLICABLE), e.g. a draft the engine ignores
        self.not_applicable: dict[str, str] = {}
        # the engine's own non-speculative greedy decoding, when it has one
        # (target_greedy_generate(target, prompt_ids, max_new_tokens, stop_ids=()) -> tokens)
        self.own_greedy = None

    def __repr__(self):
        return f"Impl({self.spec!r})"

    def has(self, level: str) -> bool:
        return level in self.levels

    def has_function(self, name: str) -> bool:
        return name in self.functions

    def accepts(self, function: str, keyword: str) -> bool:
        return keyword in self.keywords.get(function, ())

    def __getattr__(self, name):
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(name)

    def header(self) -> str:
        parts = []
        for level in self.levels:
            names = []
            for sig in LEVELS[level]:
                extra = sorted(self.keywords.get(sig.function, ()))
                names.append(sig.function + (f" [+{', '.join(extra)}]" if extra else ""))
            parts.append(f"{level} ({'; '.join(names)})")
        lacking = [f"{level} (no {', '.join(names)}"
                   + "".join(f"; found {self.hints[n]}: did you mean {n}?" for n in names
                             if n in self.hints) + ")"
                   for level, names in self.missing.items()]
        text = (f"implementation under test: --impl={self.spec} -> {self.description}\n"
                f"levels: {', '.join(parts) or 'none'}")
        if lacking:
            text += f"; not found, so not checked: {'; '.join(lacking)}"
        text += f"\nkit model kinds it runs: {', '.join(sorted(self.model_kinds))}"
        return text


def _split_attr(spec: str) -> tuple[str, str | None]:
    head, sep, tail = spec.rpartition(":")
    if sep and tail.isidentifier() and head and not (len(head) == 1 and head.isalpha()):
        return head, tail
    return spec, None


def _module_name_for_path(path: Path) -> str | None:
    """The dotted name under which `path` is importable from sys.path, if any."""
    path = path.resolve()
    for entry in sys.path:
        try:
            root = Path(entry or os.getcwd()).resolve()
        except OSError:
            continue
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        parts = rel.with_suffix("").parts
        if all(p.isidentifier() for p in parts):
            return ".".join(parts)
    return None


def _import_path(path: Path):
    name = _module_name_for_path(path)
    if name is not None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = None
        if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == path.resolve():
            return module
    name = "kit_impl_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImplError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # sibling modules of a stand-alone file import the way they would if it were run directly
    sys.path.insert(0, str(path.parent.resolve()))
    spec.loader.exec_module(module)
    return module


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _import(spec: str):
    target = ALIASES.get(spec, spec)
    pathlike = target.endswith(".py") or os.sep in target or "/" in target
    if Path(target).is_dir() and (pathlike or not _importable(target)):
        raise ImplError(f"--impl={spec} is a directory; give the .py file that defines the "
                        f"functions (e.g. {target.rstrip('/')}/speculative.py), a module name, or "
                        f"MODULE:ATTR")
    if pathlike:
        path = Path(target)
        if not path.is_file():
            raise ImplError(f"--impl={spec}: no such file {path}")
        return _import_path(path), f"file {path}"
    return importlib.import_module(target), f"module {target}"


def _check_signature(spec: str, fn, sig: Signature) -> frozenset:
    """Raise ImplError unless fn can be called the way the kit calls it; return the extra
    keywords it names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        raise ImplError(f"--impl={spec}: cannot read the signature of {sig.function}: {exc}")
    values = list(params.values())
    positional = [p for p in values if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in values)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in values)
    shown = f"{sig.function}{inspect.signature(fn)}"
    expected = f"the kit calls it as {sig.call_text()}"
    for i, name in enumerate(sig.required):
        if i >= len(positional):
            if var_pos:
                break
            raise ImplError(f"--impl={spec}: {shown} takes {len(positional)} positional "
                            f"parameters, but {expected}")
        if positional[i].name != name:
            raise ImplError(f"--impl={spec}: {shown}: positional parameter {i + 1} is named "
                            f"{positional[i].name!r}, the chapter's API names it {name!r} "
                            f"({expected})")
    required_extra = [p.name for p in positional[len(sig.required):] if p.default is p.empty]
    required_extra += [p.name for p in values if p.kind == p.KEYWORD_ONLY and p.default is p.empty
                       and p.name not in sig.optional]
    if required_extra:
        raise ImplError(f"--impl={spec}: {shown} requires {', '.join(map(repr, required_extra))}, "
                        f"which the chapter's API does not pass ({expected})")
    names = {p.name for p in values if p.kind != p.POSITIONAL_ONLY}
    for name in sig.optional:
        if name not in names and not var_kw:
            raise ImplError(f"--impl={spec}: {shown} does not accept the keyword {name!r} "
                            f"({expected})")
    return frozenset(name for name in sig.extra if name in names)


def _name_hints(source, missing) -> dict[str, str]:
    """For each missing function, a public callable of the source that takes the same leading
    parameters under another name (a misnamed engine is the likeliest reason a level is
    missing); the closest name wins."""
    signatures = {sig.function: sig for sigs in LEVELS.values() for sig in sigs}
    hints = {}
    for functions in missing.values():
        for want in functions:
            lead = signatures[want].required[:2]
            candidates = [n for n in dir(source) if not n.startswith("_") and n not in signatures
                          and _leading_parameters(getattr(source, n, None), len(lead)) == lead]
            close = difflib.get_close_matches(want, candidates, n=1, cutoff=0.5)
            if close:
                hints[want] = close[0]
    return hints


def _leading_parameters(fn, count: int) -> tuple:
    if not callable(fn) or inspect.isclass(fn):
        return ()
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params[:count]
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _not_applicable(spec: str, declared) -> dict[str, str]:
    """KIT_NOT_APPLICABLE: {family: reason}, every family one the kit has."""
    from properties.families import FAMILIES
    if not isinstance(declared, dict):
        raise ImplError(f"--impl={spec}: KIT_NOT_APPLICABLE must be a dict {{family: reason}}, "
                        f"got {type(declared).__name__}")
    unknown = [name for name in declared if name not in FAMILIES]
    if unknown:
        raise ImplError(f"--impl={spec}: KIT_NOT_APPLICABLE names unknown famil"
                        f"{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))}; "
                        f"the kit's families are {', '.join(FAMILIES)}")
    return {str(name): str(reason) for name, reason in declared.items()}


def load(spec: str) -> Impl:
    """Resolve --impl=spec into an Impl, or raise ImplError with one clear message."""
    scheme = spec.split(":", 1)[0] if spec else ""
    if scheme in SCHEMES:
        module, function = SCHEMES[scheme].split(":")
        return getattr(importlib.import_module(module), function)(spec)
    if not spec:
        raise ImplError("--impl is empty: give reference, fast, a module name or a .py path")
    module_spec, attr = _split_attr(ALIASES.get(spec, spec))
    try:
        module, description = _import(module_spec)
    except ImplError:
        raise
    except Exception as exc:  # anything the import itself raises
        raise ImplError(f"--impl={spec}: cannot import {module_spec!r}: "
                        f"{type(exc).__name__}: {exc}") from exc
    source = module
    if attr is not None:
        if not hasattr(module, attr):
            raise ImplError(f"--impl={spec}: {description} has no attribute {attr!r}")
        source = getattr(module, attr)
        description += f", attribute {attr}"
        if inspect.isclass(source):
            try:
                source = source()
            except Exception as exc:
                raise ImplError(f"--impl={spec}: cannot instantiate {attr}() with no arguments: "
                                f"{type(exc).__name__}: {exc}") from exc
            description += " (an instance)"
    impl = Impl(spec=spec, description=description)
    levels, missing = [], {}
    for level, sigs in LEVELS.items():
        found = {sig.function: getattr(source, sig.function, None) for sig in sigs}
        absent = tuple(name for name, fn in found.items() if fn is None)
        if absent:
            missing[level] = absent
            continue
        for sig in sigs:
            fn = found[sig.function]
            if not callable(fn):
                raise ImplError(f"--impl={spec}: {sig.function} is not callable "
                                f"({type(fn).__name__})")
            impl.keywords[sig.function] = _check_signature(spec, fn, sig)
            impl.functions[sig.function] = fn
        levels.append(level)
    impl.hints = _name_hints(source, missing)
    if not levels:
        names = ", ".join(sig.function for sigs in LEVELS.values() for sig in sigs)
        hints = "".join(f"; found {have}: did you mean {want}?" for want, have in impl.hints.items())
        raise ImplError(f"--impl={spec}: {description} exposes none of the kit's functions "
                        f"({names}){hints}")
    kinds = getattr(source, "KIT_MODEL_KINDS", None)
    if kinds is not None:
        kinds = frozenset(kinds)
        if not kinds or not kinds <= MODEL_KINDS:
            raise ImplError(f"--impl={spec}: KIT_MODEL_KINDS must be a non-empty subset of "
                            f"{sorted(MODEL_KINDS)}, got {sorted(kinds)}")
        impl.model_kinds = kinds
    tolerance = getattr(source, "KIT_LOGIT_TOLERANCE", None)
    if tolerance is not None:
        if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < float("inf"):
            raise ImplError(f"--impl={spec}: KIT_LOGIT_TOLERANCE must be a finite logit gap "
                            f">= 0, got {tolerance!r}")
        impl.logit_tolerance = float(tolerance)
    impl.not_applicable = _not_applicable(spec, getattr(source, "KIT_NOT_APPLICABLE", {}))
    declared = getattr(source, "KIT_METHOD", None)
    if declared is not None:
        # the method an in-process path is (properties.methods.Method): what the verdict reads,
        # e.g. a mode the engine itself names lossy
        from properties.methods import Method
        if not isinstance(declared, Method):
            raise ImplError(f"--impl={spec}: KIT_METHOD must be a properties.methods.Method, "
                            f"got {type(declared).__name__}")
        impl.method = declared
    impl.own_greedy = getattr(source, "target_greedy_generate", None)
    if impl.own_greedy is not None:
        impl.functions["target_greedy_generate"] = impl.own_greedy
    own_sampler = getattr(source, "target_generate", None)
    if own_sampler is not None:
        # the engine's own non-speculative sampler: speculation is judged against its law,
        # and its law against the convention (family "sampler")
        if not callable(own_sampler):
            raise ImplError(f"--impl={spec}: target_generate is not callable "
                            f"({type(own_sampler).__name__})")
        impl.keywords["target_generate"] = _check_signature(spec, own_sampler, OWN_SAMPLER)
        impl.functions["target_generate"] = own_sampler
    impl.levels = tuple(levels)
    impl.missing = missing
    return impl
