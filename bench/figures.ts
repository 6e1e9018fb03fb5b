/**
 * The figures `npm run bench` measures, recorded beside the lines it prints, so that `--json` can give them
 * whole: each with its unit and, where an issue sets one, its target and whether it was met.
 */
export interface Target {
  op: '<' | '<=' | '>=';
  value: number;
}

export interface Figure {
  name: string;
  value: number;
  unit: string;
  target?: Target;
  met?: boolean;
}

const recorded: Figure[] = [];

export function figure(name: string, value: number, unit: string, target?: Target): void {
  const met = target === undefined ? undefined : target.op === '<' ? value < target.value : target.op === '<=' ? value <= target.value : value >= target.value;
  recorded.push({ name, value: Number(value.toFixed(3)), unit, ...(target ? { target, met } : {}) });
}

export function figures(): readonly Figure[] {
  return recorded;
}
