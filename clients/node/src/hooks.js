// Calls a logging hook (onReplay, onConflict, onMismatch, onFenced) with an
// event; a hook that throws or rejects never changes the answer.
export function callHook(hook, event) {
  if (typeof hook !== 'function') return;
  try {
    const value = hook(event);
    if (value && typeof value.catch === 'function') value.catch(() => {});
  } catch {
    // a logging hook's error is its own
  }
}
