// Chart axes for the dashboard: where the ticks go and what they read. Pure functions with no DOM, so the
// page imports them and the tests call them directly (server/test/dashboard-ticks.test.ts).

/**
 * Evenly spaced "nice" ticks (1, 2 or 5 times a power of ten apart) covering min..max, about `count` of them.
 * A range of one value is widened around it, so a flat series still gets an axis.
 */
export function niceTicks(min, max, count = 5, integer = false) {
  if (min === max) {
    min -= integer ? 1 : Math.abs(min) * 0.1 || 1;
    max += integer ? 1 : Math.abs(max) * 0.1 || 1;
  }
  let step = 10 ** Math.floor(Math.log10((max - min) / count));
  const err = (count / (max - min)) * step;
  if (err <= 0.15) step *= 10;
  else if (err <= 0.35) step *= 5;
  else if (err <= 0.75) step *= 2;
  if (integer) step = Math.max(1, Math.round(step));
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const ticks = [];
  for (let t = lo; t <= hi + step / 2; t += step) ticks.push(Number(t.toPrecision(12)));
  return { lo, hi, ticks };
}

/** Below this (and from EXP_ABOVE up) an axis reads in exponent notation: 0.000012 is harder to read than 1.2e-5. */
const EXP_BELOW = 1e-3;
const EXP_ABOVE = 1e6;

/**
 * The labels of evenly spaced ticks: every label with the same number of digits, as few as say each tick as it
 * is (the digits the spacing needs), so no two read alike. Ticks 14.296, 14.298, 14.300 read "14.296", "14.298",
 * "14.300", never "14.3" three times; zero reads "0".
 */
export function tickLabels(ticks) {
  if (!ticks.length) return [];
  const largest = Math.max(...ticks.map((t) => Math.abs(t)));
  const gaps = ticks
    .slice(1)
    .map((t, i) => Math.abs(t - ticks[i]))
    .filter((d) => d > 0);
  const spacing = gaps.length ? Math.min(...gaps) : largest || 1;
  // The power of ten of the spacing, read from a rounded copy so 0.1 - 0.0999999 does not read as 1e-2.
  const spacingExp = Math.floor(Math.log10(Number(spacing.toPrecision(6))));
  const exponential = largest !== 0 && (largest < EXP_BELOW || largest >= EXP_ABOVE);
  const first = exponential ? Math.max(0, Math.floor(Math.log10(largest)) - spacingExp) : Math.max(0, -spacingExp);
  const format = (digits) => ticks.map((t) => (t === 0 ? '0' : exponential ? t.toExponential(Math.min(digits, 20)) : t.toFixed(Math.min(digits, 20))));
  // The spacing decides the digits; where they round a tick off (a spacing like 0.25), one more until none is.
  const exact = (labels) => labels.every((l, i) => Math.abs(Number(l) - ticks[i]) <= spacing * 1e-6) && new Set(labels).size === ticks.length;
  let digits = first;
  let labels = format(digits);
  while (!exact(labels) && digits < first + 6) labels = format(++digits);
  return labels;
}
