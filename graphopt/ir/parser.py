"""Read the text form of a graph back into a Graph: the inverse of printer.py.

`parse(str(g))` prints exactly as `g` does. The text is read in two steps: a tokenizer cuts it
into tokens (names, %values, numbers, strings, punctuation, ends of lines), then a recursive
descent parser, one method per grammar rule, builds the Graph. Grammar (EBNF; whitespace and
`#` comments are skipped between tokens, but the end of a line ends a statement):

    graph      = NL* "graph" (NAME | STRING) "{" NL+ body "}" NL* EOF ;
    body       = { (input | node) NL+ } return NL+ ;
    input      = ("param" PARAM | "arg" ARG) ":" type ;
    node       = [ ARG { "," ARG } "=" ] NAME [ values ] [ attrs ] [ after ] ":" [ types ] [ loc ]
                 [ "{" NL+ body "}" ] ;                 (* a kernel's body *)
    return     = "return" [ values ] [ after ] ;
    values     = value { "," value } ;                  value = PARAM | ARG ;
    after      = "after" "(" [ values ] ")" ;
    attrs      = "{" [ NAME "=" attr { "," NAME "=" attr } ] "}" ;
    attr       = "true" | "false" | NUMBER | "nan" | "inf" | dtype | STRING
               | "[" [ attr { "," attr } ] "]" ;
    types      = type { "," type } ;
    type       = "token" | tensor | "rows" "<" INT "," tensor [ "," "unique" ] ">" ;
    tensor     = dtype "[" [ INT { "," INT } ] "]" ;
    dtype      = "f16" | "bf16" | "f32" | "f64" | "i32" | "i64" | "bool" ;
    loc        = "loc" "(" [ "grad" ] site { "," site } ")" ;
    site       = STRING ":" INT ;
    PARAM      = "@" (ident | STRING) ;                 ARG = "%" (ident | STRING) ;
    ident      = { letter | digit | "_" | "." }- ;
    NAME       = (letter | "_") { letter | digit | "_" | "." } ;
    NUMBER     = INT | FLOAT | "-inf" ;                 (* digits are ASCII 0-9 *)
    STRING     = a JSON string literal ;

Names are looked up only after the whole graph is read, so text may use a value before the
line that defines it (or make a cycle): the parser builds such a graph and the verifier, not
the parser, rejects it. Every other mistake raises ParseError with the line and column, and
so does nesting deeper than MAX_DEPTH (lists, kernel bodies), which would otherwise exhaust
Python's stack: parsing is total, any str gives a Graph or a ParseError.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np

from ..errors import ParseError, ParseInputError
from .graph import GradLocation, Graph, Location, Node, Value
from .opdefs import constant_value
from .registry import REGISTRY, VALUE_ATTR
from .types import DTYPES, RowsType, TensorType, Type, token, value_problem

_STRING = r'"(?:[^"\\\n]|\\.)*"'
_TOKEN = re.compile(rf"""
    (?P<SKIP>[ \t\r]+|\#[^\n]*)
  | (?P<NL>\n)
  | (?P<STRING>{_STRING})
  | (?P<VALUE>[%@](?:[\w.]+|{_STRING}))
  | (?P<NUMBER>-inf(?![\w.])|-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
  | (?P<NAME>[A-Za-z_][\w.]*)
  | (?P<PUNCT>[=,:{{}}\[\]()<>])
""", re.VERBOSE)

X = TypeVar("X")

# How deep lists (`[[...]]`) and kernel bodies may nest: numpy's 64 dimensions, far more than
# any graph has (a kernel body holds no kernel), few enough for Python's stack.
MAX_DEPTH = 64

# Bare words an attribute value may be, besides the dtype names.
_WORDS = {"true": True, "false": False, "nan": float("nan"), "inf": float("inf")}


@dataclass(frozen=True)
class Token:
    kind: str  # NL, STRING, VALUE, NUMBER, NAME, PUNCT or EOF
    text: str
    line: int  # 1-based, like the column: what editors show
    col: int


def parse(text: str, *, lines: dict[Node | Value | Graph, int] | None = None) -> Graph:
    """Read a graph from its text form; raise ParseError (with line and column) if malformed,
    ParseInputError (a TypeError) if `text` is not a str.

    Args:
        text: the graph's text form.
        lines: if given, filled with the line (1-based) each node, graph input and return
            (keyed by its graph), kernel bodies' too, is written on: so that an error the
            verifier finds later can point into the text (`verify(graph, lines)`).
    """
    if not isinstance(text, str):
        hint = " (decode it first: data.decode())" if isinstance(text, (bytes, bytearray)) \
            else ""
        raise ParseInputError(f"parse takes the text of a graph as a str, got "
                              f"{type(text).__name__}{hint}")
    return _Parser(text, {} if lines is None else lines).graph()


class _Parser:
    def __init__(self, text: str, node_lines: dict[Node | Value | Graph, int]):
        self.node_lines = node_lines
        self.lines = text.split("\n")
        self.tokens = self._tokenize(text)
        self.pos = 0

    # -- tokens ---------------------------------------------------------------------------------
    def _tokenize(self, text: str) -> list[Token]:
        tokens, line, line_start, pos = [], 1, 0, 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            col = pos - line_start + 1
            if m is None:
                what = "unterminated string" if text[pos] == '"' else f"unexpected {text[pos]!r}"
                raise self.error(what, Token("?", "", line, col))
            if m.lastgroup in ("STRING", "VALUE") and m.group().endswith('"'):
                self._check_string(m.group(), Token(m.lastgroup, m.group(), line, col))
            if m.lastgroup != "SKIP":
                tokens.append(Token(m.lastgroup, m.group(), line, col))
            if m.lastgroup == "NL":
                line, line_start = line + 1, m.end()
            pos = m.end()
        tokens.append(Token("EOF", "", line, pos - line_start + 1))
        return tokens

    def _check_string(self, text: str, tok: Token) -> None:
        """A string is a JSON string literal: valid escapes, no raw control characters."""
        start = text.index('"')
        try:
            json.loads(text[start:])
        except json.JSONDecodeError as e:
            what = e.msg.removesuffix(" at").lower()
            at = Token(tok.kind, tok.text, tok.line, tok.col + start + e.pos)
            raise self.error(f"bad string: {what} (strings are JSON strings)", at) from None

    def error(self, message: str, tok: Token) -> ParseError:
        return ParseError(message, tok.line, tok.col, self.lines[tok.line - 1])

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += tok.kind != "EOF"  # EOF stays put, so errors at the end have a token
        return tok

    def at(self, text: str) -> bool:
        """Is the next token this punctuation or keyword? (Strings and %names never match.)"""
        tok = self.peek()
        return tok.kind in ("PUNCT", "NAME") and tok.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.next()
            return True
        return False

    def expect(self, text: str, context: str = "") -> Token:
        if not self.at(text):
            raise self.error(f"expected '{text}'{context}, found {_show(self.peek())}", self.peek())
        return self.next()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.peek().kind != kind:
            raise self.error(f"expected {what}, found {_show(self.peek())}", self.peek())
        return self.next()

    def commas(self, item: Callable[[], X]) -> list[X]:
        """`item { "," item }`: a list that ends where the next token is not a comma."""
        items = [item()]
        while self.accept(","):
            items.append(item())
        return items

    def until(self, close: str, item: Callable[[], X], where: str) -> list[X]:
        """`[ item { "," item } ] close`: the rest of a bracketed list, maybe empty."""
        items: list[X] = []
        while not self.accept(close):
            if items:
                self.expect(",", f" or '{close}' {where}")
            items.append(item())
        return items

    def end_of_line(self) -> None:
        """A statement ends at the end of its line; blank and comment lines may follow."""
        self.expect_kind("NL", "the end of the line")
        self.skip_newlines()

    def skip_newlines(self) -> None:
        while self.peek().kind == "NL":
            self.next()

    # -- graph structure ------------------------------------------------------------------------
    def graph(self) -> Graph:
        self.skip_newlines()
        self.expect("graph")
        tok = self.next()
        if tok.kind not in ("NAME", "STRING"):
            raise self.error(f"expected the graph's name, found {_show(tok)}", tok)
        graph = Graph(json.loads(tok.text) if tok.kind == "STRING" else tok.text)
        self.expect("{")
        self.end_of_line()
        self.body(graph, 0)
        self.skip_newlines()
        self.expect_kind("EOF", "the end of the text")
        return graph

    def body(self, graph: Graph, depth: int) -> None:
        """Read input and node lines into `graph` up to and including its closing `}`.

        A kernel node's region is a body too (its own inputs, nodes and return, its own names):
        `node` calls this method again on the kernel's body graph."""
        names: dict[str, Value] = {}
        uses: list[tuple[list[Value], list[Token]]] = []  # resolved once every line is read
        self.skip_newlines()
        while not self.at("return"):
            if self.at("}") or self.peek().kind == "EOF":
                raise self.error("expected 'return' before the end of the graph", self.peek())
            if self.at("param") or self.at("arg"):
                tok, value = self.input(graph)
                self.node_lines[value] = tok.line
                self.define(names, tok, value)
            else:
                line = self.peek().line
                results, node, operands = self.node(graph, depth)
                self.node_lines[node] = line
                for tok, value in zip(results, node.outputs):
                    self.define(names, tok, value)
                uses += [(node.inputs, operands[0]), (node.after, operands[1])]
            self.end_of_line()
        self.node_lines[graph] = self.expect("return").line
        uses.append((graph.outputs, self.values() if self.peek().kind == "VALUE" else []))
        uses.append((graph.effects, self.after() if self.at("after") else []))
        self.end_of_line()
        self.expect("}")
        for target, toks in uses:
            for tok in toks:
                if _key(tok) not in names:
                    raise self.error(f"undefined value {tok.text}", tok)
                target.append(names[_key(tok)])

    def define(self, names: dict[str, Value], tok: Token, value: Value) -> None:
        if _key(tok) in names:
            raise self.error(f"{tok.text} is defined twice", tok)
        names[_key(tok)] = value

    def input(self, graph: Graph) -> tuple[Token, Value]:
        kind = self.next().text
        sigil = "@" if kind == "param" else "%"
        tok = self.expect_kind("VALUE", f"a {sigil}name after '{kind}'")
        if tok.text[0] != sigil:
            raise self.error(f"{kind} names start with '{sigil}', found {tok.text}", tok)
        self.expect(":")
        return tok, graph.add_input(kind, _key(tok)[1:], self.type())

    def node(self, graph: Graph, depth: int) -> tuple[list[Token], Node,
                                                      tuple[list[Token], list[Token]]]:
        """One node line. Returns its result names, the node (inputs and after edges still
        empty) and the tokens naming its inputs and after edges, for `body` to resolve."""
        results = self.values() if self.peek().kind == "VALUE" else []
        for tok in results:
            if tok.text[0] != "%":
                raise self.error(f"a node defines %names, not {tok.text}", tok)
        if results:
            self.expect("=", " after the names a node defines")
        op_tok = self.expect_kind("NAME", "an op name")
        op = REGISTRY.get(op_tok.text)
        if op is None:
            raise self.error(f"unknown op '{op_tok.text}'", op_tok)
        inputs = self.values() if self.peek().kind == "VALUE" else []
        raw_attrs = self.attrs() if self.at("{") else {}
        after = self.after() if self.at("after") else []
        colon = self.expect(":", " before the result types")
        # No types means no results; "{" opens a kernel's region.
        ends = self.peek().kind in ("NL", "EOF") or self.at("loc") or self.at("{")
        types = [] if ends else self.commas(self.type)
        loc = self.loc() if self.at("loc") else None
        if len(types) != len(results):
            raise self.error(f"{len(results)} result name(s) but {len(types)} type(s)", colon)
        if op.type_attrs and (len(types) != 1 or
                              not isinstance(types[0], (TensorType, RowsType))):
            raise self.error(f"{op.name} has one tensor result", colon)
        # A value attribute (a constant's) is data of the result type.
        data = {name for name, kind in zip(op.attrs, op.attr_kinds) if kind is VALUE_ATTR}
        attrs = {name: self.attr_data(tok, value, types if name in data else None)
                 for name, (_, tok, value) in raw_attrs.items()}
        for name in op.type_attrs:
            # A constant's shape and dtype are not printed: they are read off the result type,
            # so the text never says the same thing twice.
            if name in attrs:
                raise self.error(f"{op.name}'s '{name}' is given by the result type; "
                                 f"do not write it", raw_attrs[name][0])
            attrs[name] = getattr(types[0], name)
        node = graph.add_node(op.name, (), attrs, loc=loc, out_types=types)
        if self.at("{"):  # a kernel's body: a region with its own inputs and names
            self.nest(depth, "kernel bodies")
            self.next()
            self.end_of_line()
            node.body = Graph(op.name)
            self.body(node.body, depth + 1)
        return results, node, (inputs, after)

    def attr_data(self, tok: Token, value: Any, types: list[Type] | None) -> Any:
        """The attribute a parsed value stands for. Lists become tuples (axes, shape, perm are
        tuples of int), except in a value attribute (`types` given: a constant's), where a
        list is array data of the result type and a number is rounded to it, as the tracer
        stores it (so equal constants have equal attributes)."""
        if types is not None and isinstance(value, (bool, int, float, list)):
            problem = value_problem(value, types[0].dtype)  # before rounding it to the dtype
            if problem is not None:
                raise self.error(f"constant: {problem}", tok)
        if types is not None and isinstance(value, (bool, int, float)):
            with np.errstate(over="ignore"):  # 1e39 in an f32 is inf, as numpy rounds it
                return constant_value(value, types[0].dtype)
        if not isinstance(value, list):
            return value
        if types is None:
            return _tuples(value)
        t = types[0]
        try:
            with np.errstate(over="ignore"):
                a = np.array(value, dtype=t.dtype.np_dtype)
        except (ValueError, TypeError) as e:
            raise self.error(f"this value is not an array of {t.dtype}: {e}", tok) from None
        # [] prints for every empty array, whatever its shape; give it the shape of the type.
        return a.reshape(t.shape) if a.size == 0 == t.size else a

    def values(self) -> list[Token]:
        return self.commas(lambda: self.expect_kind("VALUE", "a %name or @name"))

    def after(self) -> list[Token]:
        self.expect("after")
        self.expect("(")
        toks = self.values() if self.peek().kind == "VALUE" else []
        self.expect(")", " to close after(...)")
        return toks

    def loc(self) -> Location:
        self.expect("loc")
        self.expect("(")
        kind = GradLocation if self.accept("grad") else Location
        sites = self.commas(self.site)
        self.expect(")", " to close loc(...)")
        return kind(*sites[0], tuple(sites[1:]))

    def site(self) -> tuple[str, int]:
        """`"file":line`, one line a location names."""
        file = json.loads(self.expect_kind("STRING", "a quoted file name").text)
        self.expect(":")
        return file, self.integer("a line number")

    # -- attributes -----------------------------------------------------------------------------
    def attrs(self) -> dict[str, Any]:
        """`{k=v, ...}` as {k: (token of k, token of v, v)}, to place errors found later."""
        self.expect("{")
        attrs: dict[str, Any] = {}
        while not self.accept("}"):
            if attrs:
                self.expect(",", " or '}' in the attribute dict")
            key = self.expect_kind("NAME", "an attribute name")
            if key.text in attrs:
                raise self.error(f"attribute '{key.text}' given twice", key)
            self.expect("=", f" after attribute name '{key.text}'")
            attrs[key.text] = (key, self.peek(), self.attr())
        return attrs

    def attr(self, depth: int = 0) -> Any:
        tok = self.peek()
        if tok.text == "[" and tok.kind == "PUNCT":
            self.nest(depth, "lists")
        self.next()
        if tok.kind == "NUMBER":
            return self.number(tok)
        if tok.kind == "STRING":
            return json.loads(tok.text)
        if tok.kind == "NAME" and tok.text in _WORDS:
            return _WORDS[tok.text]
        if tok.kind == "NAME" and tok.text in DTYPES:
            return DTYPES[tok.text]
        if tok.kind == "NAME":
            raise self.error(f"unknown dtype or attribute value '{tok.text}' (dtypes: "
                             f"{', '.join(DTYPES)}; other words: {', '.join(_WORDS)})", tok)
        if tok.text == "[":
            return self.until("]", lambda: self.attr(depth + 1), "in the list")
        raise self.error(f"expected an attribute value, found {_show(tok)}", tok)

    # -- types ----------------------------------------------------------------------------------
    def type(self) -> Type:
        tok = self.expect_kind("NAME", "a type such as f32[4,3] or token")
        if tok.text == "token":
            return token
        if tok.text == "rows":
            self.expect("<", " after rows")
            count = self.integer("the number of rows (an integer >= 0)")
            self.expect(",", " after the number of rows")
            dense = self.tensor_type(self.expect_kind("NAME", "a tensor type such as f32[4,3]"))
            unique = self.accept(",") and self.expect("unique", " (the only flag of rows)")
            self.expect(">", " to close rows<...>")
            return RowsType(count, dense, bool(unique))
        return self.tensor_type(tok)

    def tensor_type(self, tok: Token) -> TensorType:
        if tok.text not in DTYPES:
            raise self.error(f"unknown dtype '{tok.text}' (graphopt has {', '.join(DTYPES)})",
                             tok)
        self.expect("[", f" after dtype {tok.text}")
        shape = self.until("]", lambda: self.integer("a dimension (an integer >= 0)"),
                           "in the shape")
        return TensorType(tuple(shape), DTYPES[tok.text])

    def integer(self, what: str) -> int:
        tok = self.peek()
        if tok.kind != "NUMBER" or not re.fullmatch(r"[0-9]+", tok.text):
            raise self.error(f"expected {what}, found {_show(tok)}", tok)
        return self.number(self.next())

    def number(self, tok: Token) -> int | float:
        text = tok.text
        if any(c in text for c in ".eEi"):
            return float(text)  # (past f64's range: inf, as in Python)
        try:
            return int(text)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise self.error(f"an integer of {len(text.lstrip('-'))} digits is too long",
                             tok) from None

    def nest(self, depth: int, what: str) -> None:
        """Refuse to open a level past MAX_DEPTH: the parser would run out of stack."""
        if depth >= MAX_DEPTH:
            raise self.error(f"{what} nest more than {MAX_DEPTH} deep", self.peek())


def _key(tok: Token) -> str:
    """The name a %name or @name token defines or uses: `%"a b"` and `%a` spellings agree."""
    rest = tok.text[1:]
    return tok.text[0] + (json.loads(rest) if rest.startswith('"') else rest)


def _tuples(x: Any) -> Any:
    return tuple(_tuples(e) for e in x) if isinstance(x, list) else x


def _show(tok: Token) -> str:
    ends = {"NL": "the end of the line", "EOF": "the end of the text"}
    return ends.get(tok.kind, repr(tok.text))
