package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Response is an HTTP response as the middleware records and replays it.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// stored is the jsonb the Node and Python clients store too:
// { status, headers, body, encoding? }. Header names are lower case, a value
// is a string or, repeated, an array of strings; body is the text of the
// body, or its base64 with encoding "base64" when it is not UTF-8 (or holds
// a NUL byte, which jsonb text cannot).
type stored struct {
	Status   int                        `json:"status"`
	Headers  map[string]json.RawMessage `json:"headers"`
	Body     *string                    `json:"body"`
	Encoding string                     `json:"encoding,omitempty"`
}

// Headers that describe one transfer, not the response: never stored.
var transientHeaders = map[string]bool{
	"connection": true, "content-length": true, "date": true, "keep-alive": true,
	"transfer-encoding": true, "idempotent-replayed": true,
}

func encodeResponse(resp Response) ([]byte, error) {
	headers := map[string]any{}
	for name, values := range resp.Header {
		lower := strings.ToLower(name)
		if transientHeaders[lower] || len(values) == 0 {
			continue
		}
		if len(values) == 1 {
			headers[lower] = values[0]
		} else {
			headers[lower] = values
		}
	}
	value := map[string]any{"status": resp.Status, "headers": headers}
	if utf8.Valid(resp.Body) && bytes.IndexByte(resp.Body, 0) < 0 {
		value["body"] = string(resp.Body)
	} else {
		value["body"] = base64.StdEncoding.EncodeToString(resp.Body)
		value["encoding"] = "base64"
	}
	return json.Marshal(value)
}

// decodeResponse reads a stored response; ok is false when doc is not one
// (a key completed by a worker with a result of its own).
func decodeResponse(doc []byte) (resp Response, ok bool) {
	var s stored
	if json.Unmarshal(doc, &s) != nil || s.Status == 0 || s.Headers == nil || s.Body == nil {
		return Response{}, false
	}
	resp = Response{Status: s.Status, Header: http.Header{}, Body: []byte(*s.Body)}
	if s.Encoding == "base64" {
		body, err := base64.StdEncoding.DecodeString(*s.Body)
		if err != nil {
			return Response{}, false
		}
		resp.Body = body
	}
	for name, raw := range s.Headers {
		var one string
		var many []string
		if json.Unmarshal(raw, &one) == nil {
			resp.Header.Add(name, one)
		} else if json.Unmarshal(raw, &many) == nil {
			for _, v := range many {
				resp.Header.Add(name, v)
			}
		}
	}
	return resp, true
}

// JSONResponse: status and value as JSON.
func JSONResponse(status int, value json.RawMessage) Response {
	var body bytes.Buffer
	if json.Compact(&body, value) != nil {
		body.Reset()
		body.Write(value)
	}
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}}, Body: body.Bytes()}
}

// Problem: an RFC 9457 problem document, as the other clients write it.
func Problem(status int, title, detail string) Response {
	body, _ := json.Marshal(struct {
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{title, status, detail})
	return Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: body}
}

// ExpiredProblem: 410 Gone for a duplicate of a key whose stored response
// has passed its retention (only the key's tombstone is left): a problem
// document, as the other clients write it, naming the key.
func ExpiredProblem(key string) Response {
	body, _ := json.Marshal(struct {
		Title          string `json:"title"`
		Status         int    `json:"status"`
		Detail         string `json:"detail"`
		IdempotencyKey string `json:"idempotency_key"`
	}{"Idempotent response expired", http.StatusGone,
		"The request with Idempotency-Key " + strconv.Quote(key) +
			" was already processed; its stored response has expired and cannot be replayed.", key})
	return Response{Status: http.StatusGone, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: body}
}

// write sends resp, with its headers over any the outer handlers set.
func (resp Response) write(w http.ResponseWriter) {
	for name, values := range resp.Header {
		w.Header()[http.CanonicalHeaderKey(name)] = values
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.Body)))
	w.WriteHeader(resp.Status)
	w.Write(resp.Body) //nolint:errcheck // the client went away: nothing to do
}
