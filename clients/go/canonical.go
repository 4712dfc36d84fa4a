package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

// canonicalJSON re-encodes a JSON document with object keys sorted and no
// spacing, writing strings and numbers exactly as JavaScript's
// JSON.stringify does, so that a Go and a Node service fingerprint the same
// document alike and can share keys.
func canonicalJSON(doc []byte) ([]byte, error) {
	var value any
	decoder := json.NewDecoder(bytes.NewReader(doc))
	// Numbers as text: one out of float64's range is Infinity in
	// JavaScript (written null), not an error.
	decoder.UseNumber()
	if err := decoder.Decode(&value); err != nil {
		return nil, err
	}
	if decoder.More() {
		return nil, fmt.Errorf("trailing data after the JSON document")
	}
	var out bytes.Buffer
	writeCanonical(&out, value)
	return out.Bytes(), nil
}

func writeCanonical(out *bytes.Buffer, value any) {
	switch v := value.(type) {
	case nil:
		out.WriteString("null")
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64) // ±Inf when out of range
		out.WriteString(jsNumber(f))
	case string:
		writeJSString(out, v)
	case []any:
		out.WriteByte('[')
		for i, item := range v {
			if i > 0 {
				out.WriteByte(',')
			}
			writeCanonical(out, item)
		}
		out.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for key := range v {
			keys = append(keys, key)
		}
		sortUTF16(keys)
		out.WriteByte('{')
		for i, key := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			writeJSString(out, key)
			out.WriteByte(':')
			writeCanonical(out, v[key])
		}
		out.WriteByte('}')
	}
}

// sortUTF16 sorts as JavaScript's Array.prototype.sort: by UTF-16 code
// units, where a character beyond U+FFFF (a surrogate pair, D800-DFFF)
// comes before U+E000-U+FFFF, unlike in UTF-8's byte order.
func sortUTF16(keys []string) {
	units := make(map[string][]uint16, len(keys))
	for _, k := range keys {
		units[k] = utf16.Encode([]rune(k))
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := units[keys[i]], units[keys[j]]
		for n := 0; n < len(a) && n < len(b); n++ {
			if a[n] != b[n] {
				return a[n] < b[n]
			}
		}
		return len(a) < len(b)
	})
}

// writeJSString escapes as JSON.stringify: quote, backslash and control
// characters only (\b \f \n \r \t by name, others as \u00xx).
func writeJSString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			out.WriteString(`\"`)
		case '\\':
			out.WriteString(`\\`)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(out, `\u%04x`, r)
			} else {
				out.WriteRune(r)
			}
		}
	}
	out.WriteByte('"')
}

// jsNumber formats a number as JavaScript's Number.prototype.toString: the
// shortest digits that round-trip, plain notation from 1e-6 up to 1e21.
func jsNumber(f float64) string {
	if f == 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		if f == 0 {
			return "0"
		}
		return "null"
	}
	sign := ""
	if f < 0 {
		sign, f = "-", -f
	}
	// d.ddddde±x: the digits and the decimal exponent n (value = 0.digits × 10^n).
	mantissa, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	digits := strings.Replace(mantissa, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	n, k := x+1, len(digits)
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	e := "+"
	if n-1 < 0 {
		e = "-"
	}
	m := digits[:1]
	if k > 1 {
		m += "." + digits[1:]
	}
	return sign + m + "e" + e + strconv.Itoa(abs(n-1))
}

func abs(i int) int {
	if i < 0 {
		return -i
	}
	return i
}
