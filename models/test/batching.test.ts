import { describe, expect, it } from 'vitest';
import { BatchQueue, flushSoon, type Batches } from '../batch-queue.js';
import { LruMap } from '../lru.js';

describe('LruMap', () => {
  it('evicts the least recently set or got entry beyond its capacity; peek leaves the order alone', () => {
    const evicted: string[] = [];
    const lru = new LruMap<string, number>(2, (key) => evicted.push(key));
    lru.set('a', 1).set('b', 2);
    expect(lru.get('a')).toBe(1);
    lru.set('c', 3);
    expect(evicted).toEqual(['b']);
    expect(lru.peek('a')).toBe(1);
    lru.set('d', 4);
    expect(evicted).toEqual(['b', 'a']);
    lru.set('c', 30);
    lru.set('e', 5);
    expect(evicted).toEqual(['b', 'a', 'd']);
    expect([lru.peek('c'), lru.peek('e'), lru.size]).toEqual([30, 5, 2]);
  });
});

describe('BatchQueue', () => {
  it('runs the oldest request with up to maxBatch more of its key, in arrival order; a failed batch again one by one, so only the failing request fails', async () => {
    const batches: string[][] = [];
    let held: Batches | null = null;
    const queue = new BatchQueue<string, string>({
      keyOf: (r) => r[0]!,
      maxBatch: 2,
      run: async (batch) => {
        batches.push(batch);
        if (batch.includes('b1')) throw new Error('no b1');
        return batch.map((r) => r.toUpperCase());
      },
      schedule: (q) => {
        held = q;
      },
    });
    const results = ['a1', 'b1', 'a2', 'a3', 'b2'].map((r) => queue.push(r).catch((e: Error) => e.message));
    while (held!.size) await held!.runBatch();
    expect(batches).toEqual([['a1', 'a2'], ['b1', 'b2'], ['b1'], ['b2'], ['a3']]);
    expect(await Promise.all(results)).toEqual(['A1', 'no b1', 'A2', 'A3', 'B2']);
  });

  it('takes only the requests that fit with those already taken; the others wait, in order, for a later batch', async () => {
    const batches: number[][] = [];
    let held: Batches | null = null;
    const queue = new BatchQueue<number, number>({
      keyOf: () => '',
      maxBatch: 16,
      fits: (taken, next) => taken.reduce((a, b) => a + b, 0) + next <= 10,
      run: async (batch) => {
        batches.push(batch);
        return batch;
      },
      schedule: (q) => {
        held = q;
      },
    });
    const all = Promise.all([6, 5, 3, 12, 1].map((n) => queue.push(n)));
    while (held!.size) await held!.runBatch();
    await all;
    // The head always runs, even alone over the limit.
    expect(batches).toEqual([[6, 3, 1], [5], [12]]);
  });

  it('flushSoon gathers what is pushed in the same turn, and waits for the expected requests a few milliseconds at most', async () => {
    const batches: number[][] = [];
    let expected = 3;
    let gaveUp = 0;
    const queue = new BatchQueue<number, number>({
      keyOf: () => '',
      maxBatch: 16,
      run: async (b) => {
        batches.push(b);
        return b;
      },
      schedule: flushSoon(
        () => expected,
        3,
        () => gaveUp++,
      ),
    });
    await Promise.all([queue.push(1), queue.push(2)]);
    expect(batches).toEqual([[1, 2]]);
    expect(gaveUp).toBe(1);
    expected = 2;
    const late = queue.push(3);
    setTimeout(() => void queue.push(4), 1);
    await late;
    expect(gaveUp).toBe(1);
    expected = 1;
    await queue.push(5);
    expect(batches).toEqual([[1, 2], [3, 4], [5]]);
    expect(gaveUp).toBe(1);
  });
});
