package idempotency

import (
	"encoding/json"
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
