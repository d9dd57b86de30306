"""A condition over the ``episodes`` view given as text from outside the process (the REST service's ``where=``):
parsed into a typed expression that trajstore renders as SQL itself, so that no request text ever reaches SQL.

The grammar is the part of SQL a condition over one row needs, and nothing that reads, writes or sets anything:

- columns, bare (``episode_return``) or double-quoted (``"config.algo"``): never qualified, never a table;
- literals: numbers, single-quoted strings (``'it''s'``), ``TRUE``, ``FALSE``, ``NULL``;
- arithmetic ``+ - * / %``, comparisons ``= == != <> < <= > >=``, ``AND``, ``OR``, ``NOT``, parentheses;
- ``x [NOT] IN (literal, …)``, ``x [NOT] BETWEEN a AND b``, ``x IS [NOT] NULL``, ``x [NOT] LIKE|ILIKE 'pattern'``;
- the pure scalar functions of :data:`FUNCTIONS` (``abs(episode_return) > 10``, ``starts_with(run_id, 'ppo')``).

Anything else — a subquery, a table function, a second statement, a cast, a comment, an unknown function — is an
:class:`~trajstore.errors.InputError` naming ``where`` and the position, before any SQL is run. The rendering
quotes every identifier and every literal (:mod:`trajstore.query.sql`) and parenthesises every operation, so the
SQL means exactly the tree that was parsed.

>>> parse("episode_return > 100 AND run_id IN ('a', 'b''c')").sql
'(("episode_return" > 100::BIGINT) AND ("run_id" IN (\\'a\\', \\'b\\'\\'c\\')))'
>>> parse("1 = 1) OR (1 = 1")
Traceback (most recent call last):
...
trajstore.errors.InputError: where: unexpected ')' at character 6 of '1 = 1) OR (1 = 1'
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Iterator, Union

from trajstore.errors import InputError
from trajstore.query import sql

MAX_DEPTH = 64  # nested parentheses, NOTs and operations: deeper text is refused, never a RecursionError
MAX_LENGTH = 10_000  # characters of one condition
MAX_ITEMS = 10_000  # values in one IN list

# Pure scalar functions over one row's values (name: how many arguments; None for any number >= 1). None reads or
# writes anything outside its arguments; regexp functions use RE2 (linear time).
FUNCTIONS: dict[str, tuple[int, int | None]] = {
    "abs": (1, 1), "sign": (1, 1), "round": (1, 2), "floor": (1, 1), "ceil": (1, 1), "sqrt": (1, 1),
    "ln": (1, 1), "log10": (1, 1), "log2": (1, 1), "exp": (1, 1), "power": (2, 2), "pow": (2, 2),
    "least": (1, None), "greatest": (1, None), "coalesce": (1, None), "isnan": (1, 1), "isinf": (1, 1),
    "isfinite": (1, 1), "lower": (1, 1), "upper": (1, 1), "length": (1, 1), "starts_with": (2, 2),
    "ends_with": (2, 2), "contains": (2, 2), "regexp_matches": (2, 2),
}
KEYWORDS = {"and", "or", "not", "in", "is", "null", "true", "false", "between", "like", "ilike"}
# SQL's words for what a condition does not do: refused where a bare column name would stand (quoted, "select" is a
# column like any other)
RESERVED = {"select", "from", "where", "union", "except", "intersect", "with", "as", "cast", "case", "when", "then",
            "else", "end", "exists", "any", "all", "some", "table", "limit", "offset", "order", "group", "having",
            "join", "copy", "attach", "detach", "install", "load", "set", "reset", "pragma", "call", "create", "drop",
            "alter", "insert", "update", "delete", "values", "export", "import", "checkpoint", "use", "describe"}
COMPARISONS = {"=": "=", "==": "=", "!=": "<>", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")+")
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|<>|!=|==|[=<>+\-*/%(),])
""", re.VERBOSE)


# --- the tree ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    name: str

    def render(self) -> str:
        return sql.ident(self.name)


@dataclass(frozen=True)
class Value:
    value: Union[int, float, str, bool, None]

    def render(self) -> str:
        if isinstance(self.value, int) and not isinstance(self.value, bool) and -2**63 <= self.value < 2**63:
            return f"{sql.literal(self.value)}::BIGINT"  # arithmetic in 64 bits, as over the int64 columns
        return sql.literal(self.value)


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple[Node, ...]

    def render(self) -> str:
        return sql.call(self.function, [a.render() for a in self.args])


@dataclass(frozen=True)
class Operation:
    """``left op right``, or ``op right`` for ``NOT`` and a unary minus (``left`` None)."""

    op: str
    left: Node | None
    right: Node

    def render(self) -> str:
        return sql.operation(self.op, None if self.left is None else self.left.render(), self.right.render())


@dataclass(frozen=True)
class Predicate:
    """``operand IN (…)``, ``BETWEEN a AND b``, ``IS NULL``, ``LIKE p`` (``negated`` adds NOT)."""

    kind: str  # "in", "between", "null", "like", "ilike"
    operand: Node
    args: tuple[Node, ...] = ()
    negated: bool = False

    def render(self) -> str:
        return sql.predicate(self.kind, self.operand.render(), [a.render() for a in self.args], self.negated)


Node = Union[Column, Value, Call, Operation, Predicate]


@dataclass(frozen=True)
class Condition:
    """A parsed condition: ``text`` as given, ``tree``, the ``columns`` it names and its SQL (:attr:`sql`)."""

    text: str
    tree: Node
    columns: tuple[str, ...] = field(default=())

    @property
    def sql(self) -> str:
        return self.tree.render()

    def __str__(self) -> str:
        return self.text


# --- parsing ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    kind: str  # number, string, quoted, word, op, end
    text: str
    at: int


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` (an :class:`InputError` at the first character that starts none)."""
    out, at = [], 0
    while at < len(text):
        if text.startswith(("--", "/*"), at):
            raise _error(text, at, f"unexpected {text[at:at + 2]!r} (a condition holds no comments)")
        found = TOKEN.match(text, at)
        if found is None:
            raise _error(text, at, f"unexpected {text[at]!r}")
        if found.lastgroup != "space":
            out.append(Token(found.lastgroup or "", found.group(), at))
        at = found.end()
    out.append(Token("end", "", len(text)))
    return out


def parse(text: str) -> Condition:
    """The condition ``text`` means (see the module's docstring), or an :class:`InputError` naming ``where``."""
    if not isinstance(text, str):
        raise InputError(f"where: expected a condition as text, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise InputError(f"where: at most {MAX_LENGTH:,} characters, got {len(text):,}")
    if not text.strip():
        raise InputError("where: empty; give a condition such as \"episode_return > 100\"")
    parser = _Parser(text, tokens(text))
    tree = parser.condition()
    parser.expect_end()
    return Condition(text, tree, tuple(dict.fromkeys(parser.columns)))


class _Parser:
    """Recursive descent, one method per level of precedence (lowest first)."""

    def __init__(self, text: str, items: list[Token]) -> None:
        self.text, self.items, self.at, self.depth = text, items, 0, 0
        self.columns: list[str] = []

    # -- token helpers
    @property
    def token(self) -> Token:
        return self.items[self.at]

    def take(self) -> Token:
        token = self.items[self.at]
        self.at += 1
        return token

    def word(self, *words: str) -> bool:
        """Whether the next token is one of the keywords ``words`` (taken if so)."""
        if self.token.kind == "word" and self.token.text.lower() in words:
            self.at += 1
            return True
        return False

    def symbol(self, *symbols: str) -> str | None:
        if self.token.kind == "op" and self.token.text in symbols:
            return self.take().text
        return None

    def expect(self, symbol: str) -> None:
        if self.symbol(symbol) is None:
            raise self.unexpected(f"expected {symbol!r}")

    def expect_end(self) -> None:
        if self.token.kind != "end":
            raise self.unexpected()

    def unexpected(self, hint: str = "") -> InputError:
        token = self.token
        what = "the end" if token.kind == "end" else repr(token.text)
        return _error(self.text, token.at, f"unexpected {what}" + (f" ({hint})" if hint else ""))

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _error(self.text, self.token.at, f"nested more than {MAX_DEPTH} deep")
        yield
        self.depth -= 1

    # -- the levels
    def condition(self) -> Node:
        with self.nested():
            node = self.conjunction()
            while self.word("or"):
                node = Operation("OR", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.word("and"):
            node = Operation("AND", node, self.negation())
        return node

    def negation(self) -> Node:
        if self.word("not"):
            with self.nested():
                inner = self.negation()
            return Operation("NOT", None, inner)
        return self.predicate()

    def predicate(self) -> Node:
        left = self.sum()
        op = self.symbol(*COMPARISONS)
        if op is not None:
            return Operation(COMPARISONS[op], left, self.sum())
        if self.word("is"):
            negated = self.word("not")
            if not self.word("null"):
                raise self.unexpected("expected NULL after IS")
            return Predicate("null", left, negated=negated)
        negated = self.word("not")
        if self.word("in"):
            return Predicate("in", left, self.values(), negated)
        if self.word("between"):
            low = self.sum()
            if not self.word("and"):
                raise self.unexpected("expected AND in BETWEEN")
            return Predicate("between", left, (low, self.sum()), negated)
        for kind in ("like", "ilike"):
            if self.word(kind):
                return Predicate(kind, left, (self.literal(),), negated)
        if negated:
            raise self.unexpected("expected IN, BETWEEN, LIKE or ILIKE after NOT")
        return left

    def values(self) -> tuple[Node, ...]:
        self.expect("(")
        items = [self.literal()]
        while self.symbol(","):
            items.append(self.literal())
            if len(items) > MAX_ITEMS:
                raise _error(self.text, self.token.at, f"more than {MAX_ITEMS:,} values in one list")
        self.expect(")")
        return tuple(items)

    def sum(self) -> Node:
        node = self.product()
        while (op := self.symbol("+", "-")) is not None:
            node = Operation(op, node, self.product())
        return node

    def product(self) -> Node:
        node = self.unary()
        while (op := self.symbol("*", "/", "%")) is not None:
            node = Operation(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.symbol("-") is not None:
            with self.nested():
                inner = self.unary()
            return Operation("-", None, inner)
        if self.symbol("+") is not None:
            return self.unary()
        return self.atom()

    def atom(self) -> Node:
        token = self.token
        if self.symbol("(") is not None:
            with self.nested():
                node = self.condition()
            self.expect(")")
            return node
        if token.kind == "quoted":
            self.take()
            return self.column(token.text[1:-1].replace('""', '"'))
        if token.kind == "word" and token.text.lower() in RESERVED:
            raise self.unexpected("a condition selects rows by their values only: no queries, tables or statements")
        if token.kind == "word" and token.text.lower() not in KEYWORDS:
            self.take()
            if self.symbol("(") is not None:
                return self.call(token)
            return self.column(token.text)
        return self.literal()

    def literal(self) -> Value:
        token = self.token
        value: int | float | str | bool | None
        if token.kind == "number":
            self.take()
            value = float(token.text) if any(c in token.text for c in ".eE") else int(token.text[:40])
            if not math.isfinite(value) or len(token.text) > 40 and isinstance(value, int):
                raise _error(self.text, token.at, f"{token.text} is not a finite number")
            return Value(value)
        if token.kind == "string":
            self.take()
            return Value(token.text[1:-1].replace("''", "'"))
        if self.symbol("-") is not None and self.token.kind == "number":
            value = self.literal().value
            return Value(-value)  # type: ignore[operator]
        for word, value in (("true", True), ("false", False), ("null", None)):
            if self.word(word):
                return Value(value)
        raise self.unexpected("expected a column, a number or a 'string'")

    def column(self, name: str) -> Column:
        if not name or name != name.strip():
            raise _error(self.text, self.items[self.at - 1].at, f"{name!r} is not a column name")
        self.columns.append(name)
        return Column(name)

    def call(self, name: Token) -> Call:
        function = name.text.lower()
        if function not in FUNCTIONS:
            raise _error(self.text, name.at, f"unknown function {name.text!r}; the functions a condition may call: "
                                             f"{', '.join(sorted(FUNCTIONS))}")
        args: list[Node] = []
        with self.nested():
            if self.symbol(")") is None:
                args.append(self.sum())
                while self.symbol(","):
                    args.append(self.sum())
                self.expect(")")
        least, most = FUNCTIONS[function]
        if len(args) < least or (most is not None and len(args) > most):
            count = str(least) if least == most else f"{least} or more" if most is None else f"{least} to {most}"
            raise _error(self.text, name.at, f"{function}() takes {count} argument(s), got {len(args)}")
        return Call(function, tuple(args))


def _error(text: str, at: int, what: str) -> InputError:
    shown = text if len(text) <= 200 else text[:200] + "…"
    return InputError(f"where: {what} at character {at + 1} of {shown!r}")
