package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"regexp"
)

// Fingerprint is the request a key stands for: the same key with another
// fingerprint is a mismatch (422). The default is the Node and Python
// clients' own, so that services in either language can share keys.
type Fingerprint func(r *http.Request, body []byte) any

var jsonContentType = regexp.MustCompile(`(?i)^application/([\w.+-]*\+)?json\b`)

// DefaultFingerprint: method, path (without the query) and a SHA-256 of the
// body; a JSON body (by its content type) is hashed in canonical form (keys
// sorted, no spacing), so that two encodings of one document are the same
// request.
func DefaultFingerprint(r *http.Request, body []byte) any {
	return map[string]string{"method": r.Method, "path": r.URL.Path, "body": bodyDigest(r, body)}
}

func bodyDigest(r *http.Request, body []byte) string {
	if len(body) > 0 && jsonContentType.MatchString(r.Header.Get("Content-Type")) {
		// Not JSON after all: its bytes are hashed as they are.
		if canonical, err := canonicalJSON(body); err == nil {
			body = canonical
		}
	}
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}
