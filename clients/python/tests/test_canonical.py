"""The canonical form of a JSON body, against what the Node client's
canonicalJson prints for the same body as Express's JSON parser reads it:
a Python, a Node and a Go service behind one scope must fingerprint every
request alike, or a genuine retry gets 422. No database needed."""

import base64
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from pg_idempotency import _canonical
from pg_idempotency.http import body_digest

FINGERPRINT_JS = Path(__file__).resolve().parents[2] / "node" / "src" / "fingerprint.js"

CASES = [
    '{"b":{"d":1,"c":[{"z":1,"a":2}]},"a":{"y":{"x":{}}}}',
    '{"b":1,"a":2,"aa":3,"A":4,"":5,"10":6,"9":7,"_":8,"~":9}',
    '{"\uff61":1,"\U0001F600":2,"é":3,"z":4,"\u00ff":5,"\ue000":6}',
    '{"a":1,"b":2,"a":3}',
    ' {\n\t"a" : [ 1 , 2 ] ,\r\n "b":"c d" } ',
    r'"quote \" backslash \\ slash \/ \b\f\n\r\t \u0001 \u001f \u007f \u2028 \u2029"',
    r'{"s":"\u00e9\ud83d\ude00 é😀 \u0000 \uFFFF","lone":["\ud800","\udc00x"],"\udbff":1}',
    '[0, 1, -1, 100, 9007199254740991, 9007199254740993, 123456789012345678901234567890]',
    '[1.0, 2.50, -1.5, 0.1, 0.30000000000000004, 1E2, 1e-7, 0.000001, 0.0000001, -1.5e-10]',
    '[1e20, 1e21, 1e+21, 123e19, 5e-324, 1.7976931348623157e308, 1e400, -1e400, 1e5, 1.5e-7]',
    '[-0, -0.0, -0e5, 0e-5]',
    '{"amount":1500}', '{"amount":1500.0}', '{"amount":1.5e3}',
    '[[], {}, [[1, [2, [3]]]], [null, true, false], [{"b":1,"a":2}]]',
    'null', '"just a string"', '1.0', '{}',
]


def random_bodies(seed, count):
    """JSON documents with numbers of every form JSON allows."""
    rng = random.Random(seed)

    def number():
        forms = [
            lambda: str(rng.randint(-10**6, 10**6)),
            lambda: str(rng.randint(-10**25, 10**25)),
            lambda: repr(rng.uniform(-1e6, 1e6)),
            lambda: f"{rng.randint(1, 99)}e{rng.randint(-30, 30)}",
            lambda: f"{rng.randint(0, 1000)}.{rng.randint(0, 1000)}",
            lambda: f"{rng.randint(0, 9)}.{rng.randint(0, 10**16)}e{rng.randint(-330, 310)}",
            lambda: repr(rng.random() * 10 ** rng.randint(-20, 25)),
        ]
        return rng.choice(forms)()

    def value(depth=0):
        roll = rng.random()
        if depth > 2 or roll < 0.5:
            return number()
        if roll < 0.6:
            return json.dumps("".join(rng.choice("aé😀\ue000\n\"\\z") for _ in range(rng.randint(0, 3))))
        if roll < 0.8:
            return "[" + ",".join(value(depth + 1) for _ in range(rng.randint(0, 4))) + "]"
        return "{" + ",".join(json.dumps(rng.choice("abcé😀\ue000")) + ":" + value(depth + 1)
                              for _ in range(rng.randint(0, 4))) + "}"
    return [value() for _ in range(count)]


def node_canonical(bodies):
    node = shutil.which("node")
    if node is None or not FINGERPRINT_JS.exists():
        pytest.skip("no node on PATH, or no Node client beside this one: nothing to compare with")
    encoded = json.dumps([base64.b64encode(b.encode("utf-8", "surrogatepass")).decode() for b in bodies])
    script = """(async () => {
const { canonicalJson } = await import(process.argv[1]);
const bodies = JSON.parse(require('fs').readFileSync(0, 'utf8'));
console.log(JSON.stringify(bodies.map((b) => canonicalJson(JSON.parse(Buffer.from(b, 'base64').toString('utf8'))))));
})()"""
    out = subprocess.run([node, "--input-type=commonjs", "-e", script, FINGERPRINT_JS.as_uri()],
                         input=encoded, capture_output=True, text=True, timeout=60, check=True).stdout
    printed = json.loads(out)
    assert len(printed) == len(bodies)
    return printed


@pytest.mark.parametrize("bodies", [CASES, random_bodies(1, 500)], ids=["cases", "random"])
def test_the_canonical_form_is_the_node_clients(bodies):
    want = node_canonical(bodies)
    for body, expected in zip(bodies, want):
        assert _canonical.dumps(_canonical.parse(body)) == expected, body


def test_a_number_written_another_way_is_the_same_request():
    digests = {body_digest(b, "application/json") for b in
               (b'{"amount":1500}', b'{"amount":1500.0}', b'{"amount": 1.5e3}', b'{"amount":15E2}')}
    assert len(digests) == 1


def test_what_javascript_cannot_parse_is_hashed_as_its_bytes():
    import hashlib
    for body in (b'{"a":NaN}', b'[Infinity]', b'{"a":-Infinity}'):
        assert body_digest(body, "application/json") == hashlib.sha256(body).hexdigest()
