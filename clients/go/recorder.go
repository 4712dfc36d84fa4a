package idempotency

import (
	"net/http"
	"strings"
)

// recorder holds what the handler writes, so that the response is recorded
// before the client sees it: the client only ever gets what a retry would.
type recorder struct {
	header http.Header
	status int
	body   []byte
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.body = append(r.body, p...)
	return len(p), nil
}

// response is what net/http would have sent: status 200 unless set, and a
// sniffed Content-Type when the handler set none, so that a replay (by any
// client) carries the same one.
func (r *recorder) response() Response {
	status := r.status
	if status == 0 {
		status = http.StatusOK
	}
	header := r.header.Clone()
	if _, set := header["Content-Type"]; !set && len(r.body) > 0 {
		header.Set("Content-Type", http.DetectContentType(r.body))
	}
	withoutNUL(header)
	return Response{Status: status, Header: header, Body: r.body}
}

// withoutNUL makes header storable (jsonb cannot hold U+0000, and a
// response that cannot be recorded leaves its key held): a NUL in a value
// becomes a space, as RFC 9110 (5.5) lets a recipient do, and a name that
// holds one, which net/http does not send, is dropped.
func withoutNUL(header http.Header) {
	for name, values := range header {
		if strings.IndexByte(name, 0) >= 0 {
			delete(header, name)
			continue
		}
		for i, v := range values {
			values[i] = strings.ReplaceAll(v, "\x00", " ")
		}
	}
}
