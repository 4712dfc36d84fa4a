// The request fingerprint sent with a key: method, path and a SHA-256 of
// the body. A JSON body is hashed in a canonical form (keys sorted, no
// spacing), so two encodings of the same document are the same request.
// The extension compares fingerprints: the same key with another one is a
// mismatch (HTTP 422).
import { createHash } from 'node:crypto';

export function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value && typeof value === 'object') {
    const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

// body: a Buffer or string (raw), a parsed JSON value, or undefined (none).
export function bodyDigest(body) {
  const hash = createHash('sha256');
  if (body === undefined || body === null) return hash.digest('hex');
  if (Buffer.isBuffer(body) || typeof body === 'string') hash.update(body);
  else hash.update(canonicalJson(body));
  return hash.digest('hex');
}

export function defaultFingerprint({ method, path, body }) {
  return { method, path, body: bodyDigest(body) };
}
