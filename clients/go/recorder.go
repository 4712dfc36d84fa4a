package idempotency

import (
	"net/http"
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
	return Response{Status: status, Header: header, Body: r.body}
}
