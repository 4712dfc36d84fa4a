package idempotency

import (
	"encoding/json"
	"strings"
)

// jsonParam is the text of a jsonb parameter: nil stays NULL, raw JSON
// ([]byte, json.RawMessage) passes as is, anything else is marshalled.
func jsonParam(v any) (any, error) {
	switch value := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if value == nil {
			return nil, nil
		}
		return string(value), nil
	case []byte:
		if value == nil {
			return nil, nil
		}
		return string(value), nil
	}
	text, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return string(text), nil
}

// holdsNUL: whether JSON text has a string with U+0000, which jsonb cannot
// hold (22P05). In JSON a backslash always begins an escape, so that an
// escaped backslash followed by u0000 is no NUL.
func holdsNUL(text string) bool {
	for i := 0; i < len(text); i++ {
		if text[i] != '\\' {
			continue
		}
		if strings.HasPrefix(text[i+1:], "u0000") {
			return true
		}
		i++ // the escaped character
	}
	return false
}
