"""Request shapes, declared once per format and checked by one walker.

Each format's room declares the shape of its request body (``gateway/chat/shape.py``,
``gateway/responses/shape.py``, ``gateway/messages/shape.py``) from these few pieces, down to
every depth its adapter reads. The adapter checks a body against it before it reads anything
(`check`), and the fuzz corpus (tests/robustness/test_shapes.py) generates its bodies from the
same declarations, so what is declared is what is refused.

    Kind      a JSON type: STRING, TEXT (non-empty string), COUNT (non-negative integer), BOOL,
              OBJECT (any object), ANY
    Enum      one of some literal values
    ListOf    an array of one shape (``nonempty``: at least one)
    Either    the first alternative whose JSON type fits (a string, or an array of parts)
    Obj       an object whose declared fields have their shapes; unknown fields are the
              provider's business and pass; ``required`` fields must be there, others may be
              absent or null
    Tagged    an object told apart by its ``type`` field: the declared case, else the one for
              how the type ends (``suffixes``), else ``other`` (None: an undeclared type is refused)

A failed check raises `Invalid` with the path of the bad field and what was expected there;
each format words it in its API's own style (the param ``input[0].content[1]`` or
``messages.0.content.1``) as a 400 in its envelope.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import BadRequest

Path = tuple[str | int, ...]
# (id of an array, n): the check passes over that array's first n elements, which the parser
# saw before, equal byte for byte, and which passed this same check then
# (gateway/pipeline/history_ids.py, ``ListMemo``).
_SKIP: ContextVar[tuple[int, int] | None] = ContextVar("shape_skip", default=None)


class Invalid(Exception):
    """The body does not fit: `path` leads to the bad field (built while the check unwinds, so a
    body that fits costs no paths)."""

    def __init__(self, path: Path, expected: str, *, missing: bool = False) -> None:
        super().__init__(expected)
        self.path = path
        self.expected = expected
        self.missing = missing

    def under(self, step: str | int) -> "Invalid":
        self.path = (step, *self.path)
        return self


class Shape:
    expected: str  # what is wanted here, in words ("a string or an array of content parts")

    def fits(self, value: Any) -> bool:
        """Whether `value` has this shape's JSON type (its inside may still be wrong)."""
        return True

    def check(self, value: Any) -> None:
        if not self.fits(value):
            raise Invalid((), self.expected)


@dataclass(frozen=True)
class Kind(Shape):
    expected: str
    types: tuple[type, ...]
    test: Callable[[Any], bool] | None = None  # beyond the JSON type (non-empty, non-negative)

    def fits(self, value: Any) -> bool:
        return isinstance(value, self.types) and (self.test is None or self.test(value))


STRING = Kind("a string", (str,))
TEXT = Kind("a non-empty string", (str,), bool)
COUNT = Kind("a non-negative integer", (int,), lambda v: not isinstance(v, bool) and v >= 0)
BOOL = Kind("a boolean", (bool,))
OBJECT = Kind("an object", (dict,))
ANY = Kind("any value", (object,))


def _plain(shape: Shape) -> tuple[type, ...] | None:
    """The JSON types that are the whole check of `shape`, None when it looks deeper."""
    return shape.types if isinstance(shape, Kind) and shape.test is None else None


@dataclass(frozen=True)
class Enum(Shape):
    values: tuple[Any, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(repr(v) for v in self.values)

    def fits(self, value: Any) -> bool:
        return isinstance(value, (str, int)) and not isinstance(value, bool) and value in self.values


@dataclass(frozen=True)
class ListOf(Shape):
    item: Shape
    nonempty: bool = False
    expected: str = "an array"
    plain: tuple[type, ...] | None = field(init=False, repr=False, compare=False)  # the item's whole check

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", _plain(self.item))

    def fits(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any) -> None:
        if not isinstance(value, list) or (self.nonempty and not value):
            raise Invalid((), f"a non-empty {self.expected.removeprefix('an ')}" if self.nonempty else self.expected)
        item, plain, skip = self.item, self.plain, _SKIP.get()
        start = skip[1] if skip is not None and skip[0] == id(value) else 0
        for i in range(start, len(value)):
            x = value[i]
            if plain is not None:
                if not isinstance(x, plain):
                    raise Invalid((i,), item.expected)
                continue
            try:
                item.check(x)
            except Invalid as exc:
                raise exc.under(i) from None


@dataclass(frozen=True)
class Either(Shape):
    options: tuple[Shape, ...]
    expected: str

    def fits(self, value: Any) -> bool:
        return any(o.fits(value) for o in self.options)

    def check(self, value: Any) -> None:
        for option in self.options:
            if option.fits(value):
                option.check(value)
                return
        raise Invalid((), self.expected)


@dataclass(frozen=True)
class Obj(Shape):
    fields: Mapping[str, Shape] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    expected: str = "an object"
    plan: tuple = field(init=False, repr=False, compare=False)  # (name, shape, plain types or None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", tuple((n, s, _plain(s)) for n, s in self.fields.items()))

    def fits(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise Invalid((), self.expected)
        get = value.get
        for name, shape, plain in self.plan:
            item = get(name)
            if item is None:
                if name in self.required:
                    raise Invalid((name,), shape.expected, missing=True)
            elif plain is not None:
                if not isinstance(item, plain):
                    raise Invalid((name,), shape.expected)
            else:
                try:
                    shape.check(item)
                except Invalid as exc:
                    raise exc.under(name) from None


def obj(expected: str = "an object", *, required: tuple[str, ...] = (), **fields: Shape) -> Obj:
    """An `Obj` from keyword fields (``required`` names those that must be present)."""
    return Obj(fields, frozenset(required), expected)


@dataclass(frozen=True)
class Tagged(Shape):
    cases: Mapping[str, Obj]
    other: Shape | None = OBJECT  # an undeclared type; None refuses it
    suffixes: Mapping[str, Obj] = field(default_factory=dict)  # undeclared types by how they end
    default: str | None = None  # the type an object without one has (Responses: "message")
    tag: str = "type"
    expected: str = "an object with a string 'type'"

    def fits(self, value: Any) -> bool:
        return isinstance(value, dict)

    def case(self, kind: str) -> Shape | None:
        if kind in self.cases:
            return self.cases[kind]
        return next((s for end, s in self.suffixes.items() if kind.endswith(end)), self.other)

    def check(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise Invalid((), self.expected)
        kind = value.get(self.tag, self.default)
        if not isinstance(kind, str):
            raise Invalid((self.tag,), "a string", missing=kind is None)
        shape = self.case(kind)
        if shape is None:
            raise Invalid((self.tag,), "one of " + ", ".join(repr(k) for k in self.cases))
        shape.check(value)


def openai_param(path: Path) -> str:
    """``input[0].content[1].text``: how OpenAI names a field in its errors."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def dotted_param(path: Path) -> str:
    """``messages.0.content.1.text``: how Anthropic names a field in its errors."""
    return ".".join(str(p) for p in path)


@dataclass(frozen=True)
class Style:
    """How an API words a refused field: its param names and its messages."""

    param: Callable[[Path], str]
    missing: str  # with {param}
    invalid: str  # with {param} and {expected}

    def check(self, shape: Shape, body: Any, known: tuple[list, int] | None = None) -> None:
        """`shape.check(body)`, a refusal raised as a 400 (BadRequest) naming the field; with
        `known` (array, n), that array's first n elements passed this check before and are not
        walked again."""
        token = _SKIP.set((id(known[0]), known[1])) if known is not None and known[1] else None
        try:
            shape.check(body)
        except Invalid as exc:
            name = self.param(exc.path)
            template = self.missing if exc.missing else self.invalid
            raise BadRequest(template.format(param=name, expected=exc.expected), param=name or None) from None
        finally:
            if token is not None:
                _SKIP.reset(token)


OPENAI = Style(openai_param, "Missing required parameter: '{param}'.", "Invalid value for '{param}': expected {expected}.")
ANTHROPIC = Style(dotted_param, "{param}: Field required", "{param}: Input should be {expected}")
