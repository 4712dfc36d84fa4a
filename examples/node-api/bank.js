// A stand-in for the core-banking API the worker calls. It is slow, and it
// must never see two operations on one account at the same time (the worker
// checks the balance, then debits: interleaved, two debits could overdraw),
// which is why the worker holds a per-account lease lock around the call.
// Accounts whose id starts with `slow-` take SLOW_BANK_MS (default 3 s),
// longer than a job's lease, so that the worker has to heartbeat.
const BANK_MS = Number(process.env.BANK_MS ?? 150);
const SLOW_BANK_MS = Number(process.env.SLOW_BANK_MS ?? 3000);

export async function debit(account, amount, idempotencyKey) {
  const ms = account.startsWith('slow-') ? SLOW_BANK_MS : BANK_MS;
  await new Promise((resolve) => setTimeout(resolve, ms));
  // A real bank takes the key too, so that our retry of a call whose
  // response was lost is not a second debit.
  return { bank_ref: `bank-${idempotencyKey}` };
}
