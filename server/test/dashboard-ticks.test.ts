import { describe, expect, it } from 'vitest';
import { niceTicks, tickLabels } from '../dashboard/assets/ticks.js';

// The dashboard's axis labels (server/dashboard/assets/ticks.js, the page's own module).

const labelsFor = (min: number, max: number, integer = false) => tickLabels(niceTicks(min, max, 5, integer).ticks);

describe('tick labels', () => {
  it('tell apart ticks that differ only in the fourth significant digit (grad norms 14.296..14.304)', () => {
    const labels = labelsFor(14.2961, 14.3042);
    expect(labels).toEqual(['14.296', '14.298', '14.300', '14.302', '14.304', '14.306']);
  });

  it('are distinct, say each tick as it is, share one number of digits and stay short, across scales', () => {
    const ranges: [number, number, boolean?][] = [
      [14.2961, 14.3042],
      [100.01, 100.02],
      [0.5, 3.2],
      [0, 1],
      [-0.2, 0.3],
      [2.5, 2.5],
      [0.00123, 0.00131],
      [1e-4, 1e-4],
      [9e-6, 1.3e-5],
      [0, 2e-5],
      [1_234_567, 1_300_000],
      [0, 7, true],
      [3, 3, true],
      [0.999_999_1, 0.999_999_9],
    ];
    for (const [min, max, integer] of ranges) {
      const { ticks } = niceTicks(min, max, 5, integer);
      const labels = tickLabels(ticks);
      const name = `${min}..${max}: ${labels.join(' ')}`;
      expect(new Set(labels).size, name).toBe(ticks.length);
      labels.forEach((l, i) => {
        expect(Math.abs(Number(l) - ticks[i]!), name).toBeLessThanOrEqual(Math.abs(ticks[1]! - ticks[0]!) * 1e-6);
      });
      const nonZero = labels.filter((l) => l !== '0');
      const digits = (l: string) => l.replace(/e.*$/, '').replace(/^-?\d*\.?/, '').length;
      expect(new Set(nonZero.map(digits)).size, name).toBe(1);
      expect(Math.max(...labels.map((l) => l.length)), name).toBeLessThanOrEqual(10);
    }
  });

  it('read zero as 0, small and large magnitudes in exponent notation, and add a digit where the spacing needs it', () => {
    expect(labelsFor(-0.2, 0.3)).toEqual(['-0.2', '-0.1', '0', '0.1', '0.2', '0.3']);
    expect(labelsFor(1e-4, 1e-4)).toEqual(['9.00e-5', '9.50e-5', '1.00e-4', '1.05e-4', '1.10e-4', '1.15e-4']);
    expect(labelsFor(1_234_567, 1_300_000)[0]).toBe('1.23e+6');
    expect(labelsFor(0, 7, true)).toEqual(['0', '2', '4', '6', '8']);
    expect(tickLabels([1, 1.25, 1.5])).toEqual(['1.00', '1.25', '1.50']);
    expect(tickLabels([5])).toEqual(['5']);
    expect(tickLabels([])).toEqual([]);
  });
});
