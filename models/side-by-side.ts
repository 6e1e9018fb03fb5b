import type { Feed } from './runner-protocol.js';
import type { LoraSite } from './transformer.js';

/**
 * Several adapters side by side along the rank: a mixed-adapter graph's layer-site LoRA inputs
 * (GraphOptions.mixedAdapters). Each site's A is [in, Σr] and B is [Σr, out], the members' columns (and
 * rows) in member order; a row's `lora_rows` holds its adapter's scale over that adapter's columns and 0
 * elsewhere. Every layer site has the adapter's rank, so one `lora_rows` serves them all.
 */
export interface Member {
  scale: number;
  /** `lora.<site>.A` [in, r] and `lora.<site>.B` [r, out]. */
  tensors: Record<string, Feed>;
}

/** Each member's rank, where its columns start, and how many there are in all. */
export interface Columns {
  starts: number[];
  ranks: number[];
  total: number;
}

/** The columns of members of ranks `ranks`, side by side in order. */
export function columnsOf(ranks: number[]): Columns {
  const starts: number[] = [];
  let total = 0;
  for (const r of ranks) {
    starts.push(total);
    total += r;
  }
  return { starts, ranks, total };
}

export class SideBySide {
  readonly tensors: Record<string, Feed> = {};
  private readonly scales: number[];
  private readonly columns: Columns;

  /** `sites`: the layer sites (the unembedding's LoRA is applied per adapter instead). */
  constructor(sites: LoraSite[], members: Member[]) {
    this.scales = members.map((m) => m.scale);
    const ranks = members.map((m) => m.tensors[`lora.${sites[0]!.key}.A`]!.dims[1]!);
    this.columns = columnsOf(ranks);
    const { starts, total } = this.columns;
    for (const site of sites) {
      const [a, b] = [`lora.${site.key}.A`, `lora.${site.key}.B`];
      if (members.some((m, j) => m.tensors[a]!.dims[1] !== ranks[j])) throw new Error(`layer site ${site.key} has other ranks than ${sites[0]!.key}`);
      // A is [in, r] row-major: each input row holds every member's r columns in turn.
      const A = new Float32Array(site.inDim * total);
      members.forEach((m, j) => {
        const own = m.tensors[a]!.data as Float32Array;
        const r = ranks[j]!;
        for (let i = 0; i < site.inDim; i++) A.set(own.subarray(i * r, (i + 1) * r), i * total + starts[j]!);
      });
      const B = new Float32Array(total * site.outDim);
      members.forEach((m, j) => {
        B.set(m.tensors[b]!.data as Float32Array, starts[j]! * site.outDim);
      });
      this.tensors[a] = { type: 'float32', data: A, dims: [site.inDim, total] };
      this.tensors[b] = { type: 'float32', data: B, dims: [total, site.outDim] };
    }
  }

  /** The `lora_rows` feed of rows whose adapters are `rowMembers` (indices into the members). */
  rowScales(rowMembers: number[]): Feed {
    const { starts, ranks, total } = this.columns;
    const data = new Float32Array(rowMembers.length * total);
    rowMembers.forEach((j, b) => {
      data.fill(this.scales[j]!, b * total + starts[j]!, b * total + starts[j]! + ranks[j]!);
    });
    return { type: 'float32', data, dims: [rowMembers.length, 1, total] };
  }
}

/**
 * One member's LoRA gradients out of a mixed-adapter backward run (`grad.<site>.A` [in, Σr], `.B` [Σr, out],
 * members side by side in order in `columns`, the same at every layer site): its own columns of A and rows
 * of B, copied out under the same names.
 */
export function memberGrads(
  sites: LoraSite[],
  { starts, ranks, total }: Columns,
  member: number,
  result: Record<string, Float32Array>,
): Record<string, Float32Array> {
  const start = starts[member]!;
  const r = ranks[member]!;
  const out: Record<string, Float32Array> = {};
  for (const site of sites) {
    const gA = result[`grad.${site.key}.A`]!;
    const A = new Float32Array(site.inDim * r);
    for (let i = 0; i < site.inDim; i++) A.set(gA.subarray(i * total + start, i * total + start + r), i * r);
    out[`grad.${site.key}.A`] = A;
    out[`grad.${site.key}.B`] = result[`grad.${site.key}.B`]!.slice(start * site.outDim, (start + r) * site.outDim);
  }
  return out;
}
