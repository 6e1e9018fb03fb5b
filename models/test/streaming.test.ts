import { describe, expect, it } from 'vitest';
import { EnginePool, sampleSequences, SAMPLING_DEFAULTS, StreamedText, zeroAdapter, type DrawnToken, type SamplingParams } from '../index.js';

const MODEL = 'Qwen/Qwen3.5-2B';
const pool = new EnginePool();
const engine = pool.get(MODEL);
const tok = pool.tokenizers.get(MODEL);
const noEos = { ...tok, eosTokenIds: [] };
const greedy: SamplingParams = { ...SAMPLING_DEFAULTS, temperature: 0, max_tokens: 6, seed: 0 };

/** A decoder over a fixed table: token i is PIECES[i]; 9 and 10 are the two halves of one UTF-8 character. */
const PIECES = ['He', 'llo', ' wor', 'ld', '!', ' E', 'ND', '\n', 'x'];
const EURO = Buffer.from('€', 'utf8');
const decode = (ids: number[]) =>
  Buffer.concat(ids.map((i) => (i === 9 ? EURO.subarray(0, 2) : i === 10 ? EURO.subarray(2) : Buffer.from(PIECES[i]!)))).toString('utf8');

function streamAll(ids: number[], stop: string[], eos: number[] = []): string[] {
  const text = new StreamedText(decode, stop, new Set(eos));
  return ids.map((id, k) => text.push(id, k === ids.length - 1));
}

describe('StreamedText: the text a stream may send as tokens arrive', () => {
  it("sends each token's text at once when no stop string could start there", () => {
    expect(streamAll([0, 1, 2, 3], [])).toEqual(['He', 'llo', ' wor', 'ld']);
    expect(streamAll([0, 1, 2, 3], ['END'])).toEqual(['He', 'llo', ' wor', 'ld']);
  });

  it('holds back a tail only while it could still start a stop string, and never sends the stop string split across tokens', () => {
    // Stop " END" spans tokens 5 and 6: " E" waits, then the stop string ends the text before it.
    expect(streamAll([0, 1, 5, 6, 4], [' END'])).toEqual(['He', 'llo', '', '', '']);
    // " E" followed by "llo" is no stop string after all: it goes out with the token that settles it.
    expect(streamAll([0, 5, 1], [' END'])).toEqual(['He', '', ' Ello']);
    // "ld!" waits on "d!" (could be the stop "d!?") only as long as it could.
    expect(streamAll([2, 3, 4, 1], ['d!?'])).toEqual([' wor', 'l', '', 'd!llo']);
    const cut = streamAll([2, 3, 4], ['ld!']);
    expect(cut.join('')).toBe(' wor');
  });

  it('releases the held tail at the end of the sequence, and end-of-sequence tokens add no text', () => {
    expect(streamAll([0, 5], [' END'])).toEqual(['He', ' E']);
    expect(streamAll([0, 1, 8], [], [8])).toEqual(['He', 'llo', '']);
  });

  it('waits for the last byte of a character split across tokens', () => {
    expect(streamAll([0, 9, 10, 1], [])).toEqual(['He', '', '€', 'llo']);
  });
});

describe('sampleSequences with hooks: each token as soon as it is drawn', () => {
  it('tells each token before the next decode step, in order, with the finish on the last; the answer is unchanged', async () => {
    const adapter = zeroAdapter(engine.sites);
    const p = tok.encode('Once upon a time');
    const [plain] = await sampleSequences(engine, adapter, p, 1, greedy, noEos);
    const told: DrawnToken[] = [];
    const stepsWhenTold: number[] = [];
    let steps = 0;
    const decodeRows = engine.decodeRows.bind(engine);
    engine.decodeRows = (...args) => {
      steps++;
      return decodeRows(...args);
    };
    try {
      const [hooked] = await sampleSequences(engine, adapter, p, 1, greedy, noEos, {
        onToken: (d) => {
          told.push(d);
          stepsWhenTold.push(steps);
        },
      });
      expect(hooked).toEqual(plain);
    } finally {
      engine.decodeRows = decodeRows;
    }
    expect(told.map((d) => d.token)).toEqual(plain!.tokens);
    expect(told.map((d) => d.logprob)).toEqual(plain!.logprobs);
    expect(told.map((d) => d.finish_reason)).toEqual([null, null, null, null, null, 'length']);
    // The first token is told before any decode step has run: before the other five exist.
    expect(stepsWhenTold).toEqual([0, 1, 2, 3, 4, 5]);
  });

  it('tells n sequences apart and a stop on the sequence that stops', async () => {
    const adapter = zeroAdapter(engine.sites);
    const p = tok.encode('The quick brown fox');
    const [free] = await sampleSequences(engine, adapter, p, 1, greedy, noEos);
    const told: DrawnToken[] = [];
    const seqs = await sampleSequences(engine, adapter, p, 2, { ...greedy, stop: [free!.tokens[2]!] }, noEos, {
      onToken: (d) => {
        told.push(d);
      },
    });
    for (const index of [0, 1]) {
      const mine = told.filter((d) => d.index === index);
      expect(mine.map((d) => d.token)).toEqual(seqs[index]!.tokens);
      expect(mine.at(-1)!.finish_reason).toBe('stop');
    }
  });

  it('an abort starts no further decode step and rejects with its reason; the engine samples on afterwards', async () => {
    const adapter = zeroAdapter(engine.sites);
    const p = tok.encode('Once upon a time');
    const controller = new AbortController();
    let steps = 0;
    let told = 0;
    const decodeRows = engine.decodeRows.bind(engine);
    engine.decodeRows = (...args) => {
      steps++;
      return decodeRows(...args);
    };
    try {
      const run = sampleSequences(engine, adapter, p, 1, { ...greedy, max_tokens: 64 }, noEos, {
        signal: controller.signal,
        onToken: () => {
          if (++told === 2) controller.abort(new Error('client went away'));
        },
      });
      await expect(run).rejects.toThrow('client went away');
    } finally {
      engine.decodeRows = decodeRows;
    }
    expect(told).toBe(2);
    expect(steps).toBe(1);
    const [after] = await sampleSequences(engine, adapter, p, 1, greedy, noEos);
    expect(after!.tokens).toHaveLength(6);
  });
});
