// The console's one way to reach the server: fetch with the Bearer key kept in sessionStorage.

const KEY_NAME = 'rebound-console-key';

export function getKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export function clearKey() {
  sessionStorage.removeItem(KEY_NAME);
}

// An answer other than 2xx, with the server's error code and message when it sent them.
export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

// Query parameters that are null, undefined or '' are left out.
export function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== '') params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

// method, path (may include a query), options: query (object), body (JSON), headers (more of
// them), key (overrides the stored one). Resolves to the parsed JSON answer (null for an empty one), rejects with ApiError.
export async function api(method, path, options = {}) {
  const key = options.key ?? getKey();
  const headers = { Accept: 'application/json', ...(options.headers || {}) };
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
  if (options.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(options.body);
  }
  let response;
  try {
    response = await fetch(withQuery(path, options.query), init);
  } catch (err) {
    throw new ApiError(0, 'network', `The server could not be reached (${err.message}).`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const err = data && typeof data === 'object' && data.error && typeof data.error === 'object'
      ? data.error : {};
    const message = typeof err.message === 'string' && err.message
      ? err.message : `HTTP ${response.status} ${response.statusText}`.trim();
    throw new ApiError(response.status, String(err.code || ''), message, err.field);
  }
  return data;
}

// Path segment for a job id (ids are A-Z a-z 0-9 . _ : -, but the text came from a client).
export function jobPath(id, tail = '') {
  return `/v1/console/jobs/${encodeURIComponent(id)}${tail}`;
}
