// Types of ticks.js (the page's own JavaScript, imported by the tests).
export function niceTicks(min: number, max: number, count?: number, integer?: boolean): { lo: number; hi: number; ticks: number[] };
export function tickLabels(ticks: number[]): string[];
