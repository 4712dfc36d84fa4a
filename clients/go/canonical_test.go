package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// canonicalCases are request bodies as a client sends them. The expected
// canonical form of each is not written here: it is what the Node client's
// canonicalJson prints for the body as Express's JSON parser reads it, so
// that a Go and a Node service fingerprint every one of them alike.
var canonicalCases = []struct{ name, body string }{
	{"nested objects", `{"b":{"d":1,"c":[{"z":1,"a":2}]},"a":{"y":{"x":{}}}}`},
	{"key order", `{"b":1,"a":2,"aa":3,"A":4,"":5,"10":6,"9":7,"_":8,"~":9}`},
	{"non-ASCII keys (UTF-16 order)", `{"` + "\uff61" + `":1,"` + "\U0001F600" + `":2,"é":3,"z":4,"` + "\u00ff" + `":5}`},
	{"duplicate keys: the last wins", `{"a":1,"b":2,"a":3}`},
	{"spacing", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":\"c d\" } "},
	{"escapes", `"quote \" backslash \\ slash \/ \b\f\n\r\t \u0001 \u001f \u007f \u2028 \u2029"`},
	{"unicode escapes and raw UTF-8", `{"s":"\u00e9\ud83d\ude00 é😀 \u0000 \uFFFF"}`},
	{"invalid UTF-8", "{\"s\":\"a\xffb\xc3\"}"},
	{"integers", `[0, 1, -1, 100, 9007199254740991, 9007199254740993, 123456789012345678901234567890]`},
	{"fractions", `[1.0, 2.50, -1.5, 0.1, 0.30000000000000004, 1E2, 1e-7, 0.000001, 0.0000001, -1.5e-10]`},
	{"exponents", `[1e20, 1e21, 1e+21, 123e19, 5e-324, 1.7976931348623157e308, 1e400, -1e400]`},
	{"negative zero", `[-0, -0.0, -0e5, 0e-5]`},
	{"arrays", `[[], {}, [[1, [2, [3]]]], [null, true, false], [{"b":1,"a":2}]]`},
	{"null", `null`},
	{"top-level scalars", `[true, "s", 1.5]`},
	{"a string alone", `"just a string"`},
	{"a number alone", `1.0`},
	{"empty object", `{}`},
}

// nodeCanonical runs the Node client's canonicalJson over every body (one
// node process) and returns what it printed for each.
func nodeCanonical(t *testing.T, bodies []string) []string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node on PATH: nothing to compare with")
	}
	src, err := filepath.Abs("../node/src/fingerprint.js")
	if err != nil {
		t.Fatal(err)
	}
	encoded := make([]string, len(bodies))
	for i, body := range bodies {
		encoded[i] = base64.StdEncoding.EncodeToString([]byte(body))
	}
	input, _ := json.Marshal(encoded)
	// As express.json does: the bytes decoded as UTF-8, then JSON.parse.
	script := `const { canonicalJson } = await import(process.argv[1]);
const bodies = JSON.parse(require('fs').readFileSync(0, 'utf8'));
console.log(JSON.stringify(bodies.map((b) => canonicalJson(JSON.parse(Buffer.from(b, 'base64').toString('utf8'))))));`
	cmd := exec.Command(node, "--input-type=commonjs", "-e", "(async () => {"+script+"})()", "file://"+src)
	cmd.Stdin = bytes.NewReader(input)
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() }) //nolint:errcheck
	defer timer.Stop()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	var printed []string
	if err := json.Unmarshal(out, &printed); err != nil || len(printed) != len(bodies) {
		t.Fatalf("node printed %q: %v", out, err)
	}
	return printed
}

func TestCanonicalJSONMatchesNode(t *testing.T) {
	bodies := make([]string, len(canonicalCases))
	for i, c := range canonicalCases {
		bodies[i] = c.body
	}
	want := nodeCanonical(t, bodies)
	for i, c := range canonicalCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := canonicalJSON([]byte(c.body))
			if err != nil {
				t.Fatalf("canonicalJSON(%q): %v", c.body, err)
			}
			if string(got) != want[i] {
				t.Fatalf("canonicalJSON(%q)\n got %s\nnode %s", c.body, got, want[i])
			}
		})
	}
}
