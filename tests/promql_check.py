"""A small PromQL syntax check (no PromQL parser is installed): a recursive-descent parser of the
expression language, returning the metric names an expression selects.

What it covers (Prometheus 2.x/3.x query grammar):

- literals: numbers (decimal, exponent, hex, ``Inf``, ``NaN``), strings ('', "", ``);
- vector selectors ``name``, ``name{l="v", l2=~"r", ...}``, ``{__name__="n"}`` (matchers ``= != =~ !~``,
  a trailing comma allowed, at least one matcher in ``{}``), range selectors ``[5m]``, subqueries
  ``[1h:5m]`` / ``[1h:]``, ``offset [-]5m``, ``@ <number> | start() | end()``; durations as
  Prometheus writes them (``1h30m``, ``500ms``, ``2d``);
- operators with their precedence and associativity (``^`` right, others left): ``or``; ``and unless``;
  ``== != > < >= <=`` (with ``bool``); ``+ -``; ``* / % atan2``; ``^``; unary ``+ -``;
  vector matching ``on(...)`` / ``ignoring(...)`` with ``group_left(...)`` / ``group_right(...)``;
- aggregations (``sum min max avg group stddev stdvar count count_values bottomk topk quantile
  limitk limit_ratio``) with ``by (...)`` / ``without (...)`` before or after the arguments, and the
  parameter of those that take one;
- function calls, of the functions Prometheus knows (:data:`FUNCTIONS`), any number of arguments;
- parentheses.

Not covered: metric names that start with a colon (legal, unusual: recording rules use inner colons),
type checking (a range vector where an instant vector is needed, the arity of a
function), and Grafana's or Prometheus's templating (``$__rate_interval``, ``{{ $labels }}``):
callers pass plain PromQL (``$var`` inside a string is a string, as Prometheus sees it after
Grafana's substitution).
"""

from __future__ import annotations

import re

__all__ = ["FUNCTIONS", "PromQLError", "metric_names"]


class PromQLError(ValueError):
    """Not PromQL (the message says where)."""


AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip
PARAMETER_AGGREGATIONS = {"count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "double_exponential_smoothing", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "minute", "month",
    "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sort_by_label",
    "sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time",
    "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time", "mad_over_time", "acos", "acosh", "asin",
    "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}  # fmt: skip
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}

_UNIT = r"(?:ms|s|m|h|d|w|y)"
_TOKEN = re.compile(
    rf"""
    (?P<ws>\s+)
  | (?P<duration>\d+{_UNIT}(?:\d+{_UNIT})*(?![A-Za-z0-9_]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|==|!=|>=|<=|[-+*/%^<>=(){{}}\[\],:@])
    """,
    re.VERBOSE,
)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PromQLError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            out.append((kind, m.group(), pos))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


# binary operators by precedence, lowest first
_LEVELS: list[set[str]] = [
    {"or"},
    {"and", "unless"},
    {"==", "!=", ">", "<", ">=", "<="},
    {"+", "-"},
    {"*", "/", "%", "atan2"},
]
_COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.metrics: list[str] = []

    # --- helpers
    def peek(self, ahead: int = 0) -> tuple[str, str, int]:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, what: str) -> PromQLError:
        kind, value, pos = self.peek()
        return PromQLError(f"{what} at {pos} (found {value or kind!r}) in {self.text!r}")

    def expect(self, value: str) -> None:
        if self.peek()[1] != value:
            raise self.fail(f"expected {value!r}")
        self.take()

    def is_op(self, values: set[str]) -> bool:
        kind, value, _ = self.peek()
        return kind in ("op", "ident") and value in values

    # --- grammar
    def parse(self) -> list[str]:
        self.expr(0)
        if self.peek()[0] != "end":
            raise self.fail("unexpected token")
        return self.metrics

    def expr(self, level: int) -> None:
        if level == len(_LEVELS):
            self.power()
            return
        self.expr(level + 1)
        while self.is_op(_LEVELS[level]):
            op = self.take()[1]
            if op in _COMPARISONS and self.peek()[1] == "bool":
                self.take()
            self.matching()
            self.expr(level + 1)

    def power(self) -> None:  # right-associative, binds tighter than * but looser than unary
        self.unary()
        if self.peek()[1] == "^":
            self.take()
            self.matching()
            self.power()

    def matching(self) -> None:
        if self.peek()[1] in ("on", "ignoring"):
            self.take()
            self.labels()
            if self.peek()[1] in ("group_left", "group_right"):
                self.take()
                if self.peek()[1] == "(":
                    self.labels()

    def labels(self) -> None:
        self.expect("(")
        while self.peek()[1] != ")":
            if self.peek()[0] != "ident":
                raise self.fail("expected a label name")
            self.take()
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != ")":
                raise self.fail("expected ',' or ')'")
        self.take()

    def unary(self) -> None:
        if self.peek()[1] in ("-", "+"):
            self.take()
            self.unary()
            return
        self.postfix()

    def postfix(self) -> None:
        self.primary()
        while True:
            value = self.peek()[1]
            if value == "[":
                self.take()
                self.duration()
                if self.peek()[1] == ":":
                    self.take()
                    if self.peek()[0] == "duration":
                        self.duration()
                self.expect("]")
            elif value == "offset":
                self.take()
                if self.peek()[1] == "-":
                    self.take()
                self.duration()
            elif value == "@":
                self.take()
                kind, v, _ = self.take()
                if kind == "ident" and v in ("start", "end"):
                    self.expect("(")
                    self.expect(")")
                elif kind != "number":
                    raise self.fail("expected a time after '@'")
            else:
                return

    def duration(self) -> None:
        if self.peek()[0] != "duration":
            raise self.fail("expected a duration such as 5m")
        self.take()

    def primary(self) -> None:
        kind, value, _ = self.peek()
        if kind == "number" or (kind == "ident" and value.lower() in ("inf", "nan")):
            self.take()
        elif kind == "string":
            self.take()
        elif value == "(":
            self.take()
            self.expr(0)
            self.expect(")")
        elif value == "{":
            self.selector(None)
        elif kind == "ident" and value in AGGREGATIONS and self.peek(1)[1] in ("(", "by", "without"):
            self.aggregation()
        elif kind == "ident" and self.peek(1)[1] == "(" and value not in KEYWORDS:
            if value not in FUNCTIONS:
                raise self.fail(f"unknown function {value!r}")
            self.take()
            self.args()
        elif kind == "ident" and value not in KEYWORDS:
            self.take()
            self.selector(value)
        else:
            raise self.fail("expected an expression")

    def args(self) -> None:
        self.expect("(")
        if self.peek()[1] != ")":
            self.expr(0)
            while self.peek()[1] == ",":
                self.take()
                self.expr(0)
        self.expect(")")

    def aggregation(self) -> None:
        name = self.take()[1]
        grouped = False
        if self.peek()[1] in ("by", "without"):
            self.take()
            self.labels()
            grouped = True
        self.expect("(")
        if name in PARAMETER_AGGREGATIONS:
            self.expr(0)
            self.expect(",")
        self.expr(0)
        self.expect(")")
        if not grouped and self.peek()[1] in ("by", "without"):
            self.take()
            self.labels()

    def selector(self, name: str | None) -> None:
        if name is not None:
            self.metrics.append(name)
        if self.peek()[1] != "{":
            return
        self.take()
        matchers = 0
        while self.peek()[1] != "}":
            kind, label, _ = self.take()
            if kind != "ident":
                raise self.fail("expected a label name")
            op = self.take()[1]
            if op not in ("=", "!=", "=~", "!~"):
                raise self.fail("expected a matcher (= != =~ !~)")
            kind, value, _ = self.take()
            if kind != "string":
                raise self.fail("expected a quoted label value")
            if label == "__name__" and op == "=":
                self.metrics.append(value[1:-1])
            matchers += 1
            if self.peek()[1] == ",":
                self.take()
            elif self.peek()[1] != "}":
                raise self.fail("expected ',' or '}'")
        self.take()
        if matchers == 0 and name is None:
            raise self.fail("a selector needs a metric name or a matcher")


def metric_names(expr: str) -> list[str]:
    """The metric names ``expr`` selects (in order); :class:`PromQLError` when it is not PromQL."""
    return _Parser(expr).parse()
