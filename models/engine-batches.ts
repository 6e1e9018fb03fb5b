/** What every request batch of the engine shares: its size, and rows grouped by adapter for a mixed-adapter run. */
import { versionKey, type LoraAdapter } from './lora.js';
import { MIXED_SLOTS } from './transformer.js';

/** Requests gathered into one batch at most (scoring chunks, prompts, or decode steps): one per adapter slot. */
export const MAX_BATCH_REQUESTS = MIXED_SLOTS;

/**
 * A batch's requests with each adapter version's together, versions in order of first arrival (stable within
 * each): the batch in that order, its adapters, each request's index among them, and with several adapters
 * each row's (`rowsOf`: a request's rows), as a mixed-adapter run takes them.
 */
export function byAdapter<T extends { adapter: LoraAdapter }>(
  arrived: T[],
  rowsOf: (request: T) => number,
): { batch: T[]; adapters: LoraAdapter[]; slots: number[]; rowAdapters?: number[] } {
  const groups = new Map<string, T[]>();
  for (const r of arrived) {
    const key = versionKey(r.adapter);
    const group = groups.get(key);
    if (group) group.push(r);
    else groups.set(key, [r]);
  }
  const lists = [...groups.values()];
  const batch = lists.flat();
  const slots = lists.flatMap((group, j) => group.map(() => j));
  const rowAdapters = lists.length > 1 ? batch.flatMap((r, i) => Array<number>(rowsOf(r)).fill(slots[i]!)) : undefined;
  return { batch, adapters: lists.map((group) => group[0]!.adapter), slots, rowAdapters };
}

/** Results computed in `batch`'s order (byAdapter), each handed back where its request arrived. */
export function inArrivalOrder<T, R>(arrived: T[], batch: T[], results: R[]): R[] {
  const at = new Map(batch.map((r, i) => [r, i]));
  return arrived.map((r) => results[at.get(r)!]!);
}
