import type { GraphBuilder, GraphNode, Sym } from './builder.js';

/**
 * Graph-level reverse-mode autodiff. Each rule receives the node, the
 * gradient of its output and the builder, and returns the gradient of each
 * input (null where none flows). New nodes are appended to the same graph.
 */
type Rule = (g: GraphBuilder, node: GraphNode, dy: Sym, need: boolean[]) => Grad[];

/** A gradient that is zero except at `indices` along `axis`: what a pick (GatherElements) sends back. */
interface SparseGrad {
  sparse: true;
  like: Sym;
  indices: Sym;
  updates: Sym;
  axis: number;
}

type Grad = Sym | SparseGrad | null;

const isSparse = (g: Sym | SparseGrad): g is SparseGrad => 'sparse' in g;

/** The dense form of a sparse gradient (zeros with the picks scattered in), or scattered into `into`. */
const densify = (g: GraphBuilder, sp: SparseGrad, into?: Sym) => g.scatterElements(into ?? g.zerosLike(sp.like), sp.indices, sp.updates, sp.axis, 'add');

/** Builds a gradient only when that input needs one, so no dead nodes enter the graph. */
const when = (needed: boolean | undefined, build: () => Sym): Sym | null => (needed ? build() : null);

const [x0, x1] = [0, 1];
const input = (n: GraphNode, i: number) => n.inputs[i]!;
const out = (n: GraphNode) => n.outputs[0]!;

export const RULES: Record<string, Rule> = {
  Identity: (_g, _n, dy) => [dy],
  Add: (g, n, dy, need) => [when(need[0], () => unbroadcast(g, dy, input(n, x0))), when(need[1], () => unbroadcast(g, dy, input(n, x1)))],
  Sub: (g, n, dy, need) => [when(need[0], () => unbroadcast(g, dy, input(n, x0))), when(need[1], () => unbroadcast(g, g.neg(dy), input(n, x1)))],
  Mul: (g, n, dy, need) => [
    when(need[0], () => unbroadcast(g, g.mul(dy, input(n, x1)), input(n, x0))),
    when(need[1], () => unbroadcast(g, g.mul(dy, input(n, x0)), input(n, x1))),
  ],
  // d(a/b) = da/b - (a/b)·db/b
  Div: (g, n, dy, need) => [
    when(need[0], () => unbroadcast(g, g.div(dy, input(n, x1)), input(n, x0))),
    when(need[1], () => unbroadcast(g, g.neg(g.div(g.mul(dy, out(n)), input(n, x1))), input(n, x1))),
  ],
  Neg: (g, _n, dy) => [g.neg(dy)],
  Exp: (g, n, dy) => [g.mul(dy, out(n))],
  Log: (g, n, dy) => [g.div(dy, input(n, x0))],
  Sqrt: (g, n, dy) => [g.div(g.mul(dy, g.scalar(0.5)), out(n))],
  // σ' = σ(1 - σ)
  Sigmoid: (g, n, dy) => [g.mul(dy, g.mul(out(n), g.sub(g.scalar(1), out(n))))],
  MatMul: (g, n, dy, need) => matmulGrads(g, input(n, x0), input(n, x1), dy, need),
  Flatten: (g, n, dy) => [g.reshapeLike(dy, input(n, x0))],
  Transpose: (g, n, dy) => [g.transpose(dy, inverse(n.attrs.perm as number[]))],
  Reshape: (g, n, dy) => [g.reshapeLike(dy, input(n, x0)), null],
  Unsqueeze: (g, n, dy) => [g.reshapeLike(dy, input(n, x0)), null],
  ReduceSum: (g, n, dy) => [g.expandLike(dy, input(n, x0)), null],
  ReduceMean: (g, n, dy) => {
    const x = input(n, x0);
    const count = (n.attrs.axes as number[]).reduce((p, a) => p * (x.shape[a < 0 ? a + x.shape.length : a] as number), 1);
    return [g.expandLike(g.div(dy, g.scalar(count)), x)];
  },
  // y = x - logsumexp(x): dx = dy - softmax(x)·Σdy
  LogSoftmax: (g, n, dy) => [g.sub(dy, g.mul(g.exp(out(n)), g.reduceSum(dy, [-1])))],
  // y = softmax(x): dx = y·(dy - Σ dy·y)
  Softmax: (g, n, dy) => [g.mul(out(n), g.sub(dy, g.reduceSum(g.mul(dy, out(n)), [-1])))],
  // Each input gets its own stretch of dy along the axis, found from the inputs' sizes at run time.
  Concat: (g, n, dy, need) => {
    const axis = n.attrs.axis as number;
    let start = g.constI([0]);
    return n.inputs.map((x, i) => {
      const end = g.add(start, g.gather(g.shapeOf(x), g.constI([axis < 0 ? axis + x.shape.length : axis]), 0));
      const dx = when(need[i], () => g.slice(dy, start, end, [axis], x.shape));
      start = end;
      return dx;
    });
  },
  // A slice along one axis sends its gradient back into zeros around it: padded by its start before and
  // by what lies past its end after, both read at run time.
  // (Starts and ends must lie within the axis, as the mixed-adapter graphs' row bounds do: no clamping here.)
  Slice: (g, n, dy) => {
    const x = input(n, x0);
    const axes = g.constantOf(n.inputs[3]!);
    if (axes?.length !== 1 || n.inputs.length > 4) throw new Error('Slice backward needs one constant axis and no steps');
    const rank = x.shape.length;
    const axis = axes[0]! < 0 ? axes[0]! + rank : axes[0]!;
    const past = g.sub(g.gather(g.shapeOf(x), g.constI([axis]), 0), input(n, 2));
    const zeros = (k: number) => (k ? [g.constI(Array(k).fill(0))] : []);
    const pads = g.concat([...zeros(axis), input(n, 1), ...zeros(rank - 1 - axis), ...zeros(axis), past, ...zeros(rank - 1 - axis)], 0, [2 * rank]);
    return [g.pad(dy, pads, x.shape), null, null, null];
  },
  // Picks send back a sparse gradient; it becomes dense (scatter-add, as an index may repeat) only where a rule needs it.
  GatherElements: (_g, n, dy) => [{ sparse: true, like: input(n, x0), indices: input(n, x1), updates: dy, axis: n.attrs.axis as number }, null],
};

/** Rules that take a sparse output gradient as it is, sparing a pass over a dense tensor of zeros. */
const SPARSE_RULES: Record<string, (g: GraphBuilder, node: GraphNode, dy: SparseGrad) => Sym | null> = {
  // dx = dy - softmax(x)·Σdy, with dy picks along the softmax axis: scatter the picks into -softmax(x)·Σpicks.
  LogSoftmax: (g, n, dy) => {
    const rank = n.inputs[0]!.shape.length;
    if (dy.axis !== -1 && dy.axis !== rank - 1) return null;
    return densify(g, dy, g.mul(g.exp(out(n)), g.neg(g.reduceSum(dy.updates, [-1]))));
  },
};

/** Gradients of `sum(seed_i · y_i)` with respect to `wrt`, appended to the graph. */
export function backprop(g: GraphBuilder, seeds: [y: Sym, dy: Sym][], wrt: Sym[]): Map<Sym, Sym> {
  // Only nodes on a path from `wrt` to the seeds need a rule.
  const needs = new Set<number>(wrt.map((s) => s.id));
  const tape = g.nodes.slice();
  for (const node of tape) if (node.inputs.some((s) => needs.has(s.id))) for (const o of node.outputs) needs.add(o.id);

  const grads = new Map<number, Sym | SparseGrad>();
  const accumulate = (s: Sym, dx: Sym | SparseGrad) => {
    const prior = grads.get(s.id);
    if (!prior) grads.set(s.id, dx);
    else if (!isSparse(prior) && !isSparse(dx)) grads.set(s.id, g.add(prior, dx));
    else if (isSparse(dx)) grads.set(s.id, densify(g, dx, isSparse(prior) ? densify(g, prior) : prior));
    else grads.set(s.id, densify(g, prior as SparseGrad, dx));
  };
  for (const [y, dy] of seeds) accumulate(y, dy);

  for (let i = tape.length - 1; i >= 0; i--) {
    const node = tape[i]!;
    let dy = grads.get(node.outputs[0]!.id);
    if (!dy || !node.inputs.some((s) => needs.has(s.id))) continue;
    if (isSparse(dy)) {
      const dx = SPARSE_RULES[node.op]?.(g, node, dy);
      if (dx) {
        if (needs.has(node.inputs[0]!.id)) accumulate(node.inputs[0]!, dx);
        continue;
      }
      dy = densify(g, dy);
    }
    const rule = RULES[node.op];
    if (!rule) throw new Error(`no backward rule for ${node.op}`);
    rule(
      g,
      node,
      dy,
      node.inputs.map((x) => needs.has(x.id)),
    ).forEach((dx, k) => {
      const x = node.inputs[k]!;
      if (dx && needs.has(x.id)) accumulate(x, dx);
    });
  }
  const result = new Map<Sym, Sym>();
  for (const w of wrt) {
    const dw = grads.get(w.id);
    if (!dw) throw new Error(`${w.name} does not reach the seeds`);
    result.set(w, isSparse(dw) ? densify(g, dw) : dw);
  }
  return result;
}

/**
 * MatMul gradients. A weight [k, n] applied to activations [..., k] gets
 * its gradient as one 2-D product over all leading positions.
 */
function matmulGrads(g: GraphBuilder, a: Sym, b: Sym, dy: Sym, need: boolean[]): (Sym | null)[] {
  const da = when(need[0], () => unbroadcast(g, g.matmul(dy, g.transposeLast(b)), a));
  if (b.shape.length === 2 && a.shape.length > 2) {
    return [da, when(need[1], () => g.matmul(g.transposeLast(g.flattenLeading(a)), g.flattenLeading(dy)))];
  }
  if (a.shape.length !== b.shape.length) throw new Error(`MatMul backward needs equal ranks or a 2-D right side, got [${a.shape}] @ [${b.shape}]`);
  return [da, when(need[1], () => unbroadcast(g, g.matmul(g.transposeLast(a), dy), b))];
}

/** Sums a gradient over the axes along which `target` was broadcast, back to target's shape. */
function unbroadcast(g: GraphBuilder, dy: Sym, target: Sym): Sym {
  const lead = dy.shape.length - target.shape.length;
  const axes: number[] = [];
  dy.shape.forEach((d, i) => {
    const t = i < lead ? undefined : target.shape[i - lead];
    if (t === undefined || (t === 1 && d !== 1)) axes.push(i);
  });
  if (!axes.length) return dy;
  const summed = g.reduceSum(dy, axes, true);
  return lead > 0 || summed.shape.length !== target.shape.length ? g.reshapeLike(summed, target) : summed;
}

function inverse(perm: number[]): number[] {
  const inv: number[] = [];
  perm.forEach((p, i) => {
    inv[p] = i;
  });
  return inv;
}
