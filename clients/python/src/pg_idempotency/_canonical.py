"""A JSON body in canonical form, written exactly as the Node.js client's
canonicalJson (JavaScript's JSON.stringify with object keys sorted), so
that a Python, a Node and a Go service fingerprint one document alike and
can share keys: numbers are JavaScript's (1500.0 is 1500, 1e5 is 100000,
an integer past 2**53 is rounded as a double), keys sort by UTF-16 code
units, and a document JSON.parse refuses (NaN, Infinity) is not JSON."""

import json
import re

# A surrogate code point left alone (json.loads pairs the ones that go
# together): JSON.stringify writes it as an escape.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse(text):
    """The document, with every number a float as JavaScript reads it;
    ValueError when it is not JSON."""
    return json.loads(text, parse_int=float, parse_constant=_refuse_constant)


def dumps(value):
    """The canonical text of a parsed document."""
    out = []
    _write(out, value)
    return "".join(out)


def _write(out, value):
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, (int, float)):
        out.append(js_number(float(value)))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(out, item)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        keys = sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))
        for i, key in enumerate(keys):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(out, value[key])
        out.append("}")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def _string(text):
    return _LONE_SURROGATE.sub(lambda m: "\\u%04x" % ord(m.group()),
                               json.dumps(text, ensure_ascii=False))


def js_number(f):
    """JavaScript's Number.prototype.toString of f: the shortest digits that
    read back as f (Python's repr has the same), in plain notation from
    1e-6 up to 1e21; NaN and the infinities are null, as JSON.stringify
    writes them."""
    if f != f or f in (float("inf"), float("-inf")):
        return "null"
    if f == 0:
        return "0"
    sign = "-" if f < 0 else ""
    mantissa, _, exponent = repr(abs(f)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    n = len(whole) + int(exponent or 0)      # f = 0.digits × 10^n
    stripped = digits.lstrip("0")
    n -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    m = digits[0] + ("." + digits[1:] if k > 1 else "")
    return sign + m + "e" + ("+" if e >= 0 else "-") + str(abs(e))
