// Responses as the middleware stores and replays them. A stored response is
// the jsonb { status, headers, body, encoding? }: body is the text of the
// body, or its base64 with encoding "base64" when it is not UTF-8.

// Headers that describe one transfer, not the response: never replayed.
const TRANSIENT_HEADERS = new Set(['connection', 'content-length', 'date', 'keep-alive',
  'transfer-encoding', 'idempotent-replayed']);

// A response: { status, headers: { name: string | string[] }, body: Buffer }.
export function response(status, headers, body) {
  return { status, headers: headers ?? {}, body: Buffer.isBuffer(body) ? body : Buffer.from(body ?? '') };
}

export function jsonResponse(status, value, headers = {}) {
  return response(status, { 'content-type': 'application/json; charset=utf-8', ...headers },
    JSON.stringify(value));
}

// RFC 9457 problem details.
export function problem(status, title, detail, headers = {}) {
  return response(status, { 'content-type': 'application/problem+json', ...headers },
    JSON.stringify({ title, status, detail }));
}

export function encodeResponse({ status, headers, body }) {
  const kept = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !TRANSIENT_HEADERS.has(name.toLowerCase())) {
      kept[name.toLowerCase()] = Array.isArray(value) ? value.map(String) : String(value);
    }
  }
  // Stored as text when it is UTF-8 without NUL (which jsonb cannot hold).
  const text = body.toString('utf8');
  if (!text.includes('\u0000') && Buffer.from(text, 'utf8').equals(body)) return { status, headers: kept, body: text };
  return { status, headers: kept, body: body.toString('base64'), encoding: 'base64' };
}

export function isStoredResponse(value) {
  return value !== null && typeof value === 'object' && Number.isInteger(value.status) &&
    typeof value.body === 'string' && value.headers !== null && typeof value.headers === 'object';
}

export function decodeResponse(stored) {
  const body = Buffer.from(stored.body, stored.encoding === 'base64' ? 'base64' : 'utf8');
  return response(stored.status, { ...stored.headers }, body);
}

// The failure text of a key failed by the middleware holds its response.
export function storedFailure(error) {
  try {
    const value = JSON.parse(error);
    return isStoredResponse(value) ? value : null;
  } catch {
    return null;
  }
}
