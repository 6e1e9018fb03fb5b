import onnxProto from 'onnx-proto';
import type * as onnxTypes from 'onnx-proto';

/**
 * A small ONNX graph builder. Each op helper records a node and returns a
 * symbolic tensor with its inferred shape, so the autodiff (autodiff.ts) can
 * read the graph back as a tape. Dimensions are numbers or names ('B', 'T').
 */
// onnx-proto is CommonJS: its `onnx` namespace arrives on the default import, typed by the package's own declarations.
const { onnx } = onnxProto as unknown as typeof onnxTypes;

export type Dim = number | string;
export type DType = 'float32' | 'int64' | 'bool';

export interface Sym {
  readonly id: number;
  readonly name: string;
  readonly shape: Dim[];
  readonly dtype: DType;
}

export interface GraphNode {
  op: string;
  inputs: Sym[];
  outputs: Sym[];
  attrs: Record<string, Attr>;
}

/** Node attributes: ints, int lists, strings, or a subgraph (If's branches). */
export type Attr = number | number[] | string | GraphBuilder;

const ELEM_TYPE: Record<DType, number> = { float32: 1, int64: 7, bool: 9 };

export class GraphBuilder {
  readonly nodes: GraphNode[] = [];
  private readonly inputs: Sym[] = [];
  private readonly outputs: Sym[] = [];
  private readonly initializers: { sym: Sym; data: Float32Array | BigInt64Array }[] = [];
  private nextId = 0;

  /** `parent`: the graph a branch belongs to; its values are read by name, so every value of both takes one id sequence. */
  constructor(
    readonly name: string,
    private readonly parent: GraphBuilder | null = null,
  ) {}

  private sym(shape: Dim[], dtype: DType, name?: string): Sym {
    const id = this.parent ? this.parent.sym([], dtype).id : this.nextId++;
    return { id, name: name ?? `t${id}`, shape, dtype };
  }

  input(name: string, dtype: DType, shape: Dim[]): Sym {
    const s = this.sym(shape, dtype, name);
    this.inputs.push(s);
    return s;
  }

  /** Marks `x` as a graph output called `name`. */
  output(x: Sym, name: string): Sym {
    // A node's result is simply renamed; an Identity (a copy at run time) only where that cannot be done:
    // a graph input, or a value already exported under another name.
    const producedHere = this.nodes.some((n) => n.outputs.includes(x));
    if (producedHere && !this.outputs.includes(x) && !this.inputs.includes(x)) {
      (x as { name: string }).name = name;
      this.outputs.push(x);
      return x;
    }
    const out = this.sym(x.shape, x.dtype, name);
    this.nodes.push({ op: 'Identity', inputs: [x], outputs: [out], attrs: {} });
    this.outputs.push(out);
    return out;
  }

  constF(values: number[] | Float32Array, shape: Dim[] = [values.length]): Sym {
    const s = this.sym(shape, 'float32');
    this.initializers.push({ sym: s, data: values instanceof Float32Array ? values : Float32Array.from(values) });
    return s;
  }

  constI(values: number[], shape: Dim[] = [values.length]): Sym {
    const s = this.sym(shape, 'int64');
    this.initializers.push({ sym: s, data: BigInt64Array.from(values.map(BigInt)) });
    return s;
  }

  /** The values of a constant made by constI (undefined for anything else): what a backward rule may read of a node's constant inputs. */
  constantOf(s: Sym): number[] | undefined {
    const init = this.initializers.find((i) => i.sym === s);
    return init && init.data instanceof BigInt64Array ? Array.from(init.data, Number) : undefined;
  }

  scalar(value: number): Sym {
    return this.constF([value], []);
  }

  /** Records a node with one output of the given shape. */
  node(op: string, inputs: Sym[], shape: Dim[], dtype: DType = inputs[0]!.dtype, attrs: Record<string, Attr> = {}): Sym {
    const out = this.sym(shape, dtype);
    this.nodes.push({ op, inputs, outputs: [out], attrs });
    return out;
  }

  // ---- ops ----------------------------------------------------------------

  add(a: Sym, b: Sym): Sym {
    return this.node('Add', [a, b], broadcast(a.shape, b.shape));
  }
  sub(a: Sym, b: Sym): Sym {
    return this.node('Sub', [a, b], broadcast(a.shape, b.shape));
  }
  mul(a: Sym, b: Sym): Sym {
    return this.node('Mul', [a, b], broadcast(a.shape, b.shape));
  }
  div(a: Sym, b: Sym): Sym {
    return this.node('Div', [a, b], broadcast(a.shape, b.shape));
  }
  neg(x: Sym): Sym {
    return this.node('Neg', [x], x.shape);
  }
  exp(x: Sym): Sym {
    return this.node('Exp', [x], x.shape);
  }
  log(x: Sym): Sym {
    return this.node('Log', [x], x.shape);
  }
  sqrt(x: Sym): Sym {
    return this.node('Sqrt', [x], x.shape);
  }
  sigmoid(x: Sym): Sym {
    return this.node('Sigmoid', [x], x.shape);
  }

  matmul(a: Sym, b: Sym): Sym {
    const batch = broadcast(a.shape.slice(0, -2), b.shape.slice(0, -2));
    return this.node('MatMul', [a, b], [...batch, a.shape[a.shape.length - 2]!, b.shape[b.shape.length - 1]!]);
  }

  transpose(x: Sym, perm: number[]): Sym {
    return this.node(
      'Transpose',
      [x],
      perm.map((p) => x.shape[p]!),
      x.dtype,
      { perm },
    );
  }

  /** Swaps the last two axes. */
  transposeLast(x: Sym): Sym {
    const perm = x.shape.map((_, i) => i);
    [perm[perm.length - 1], perm[perm.length - 2]] = [perm[perm.length - 2]!, perm[perm.length - 1]!];
    return this.transpose(x, perm);
  }

  /** ONNX Reshape: `target` may use 0 (keep that input dim) and -1 (infer); `shape` is the result's symbolic shape. */
  reshape(x: Sym, target: number[], shape: Dim[]): Sym {
    return this.node('Reshape', [x, this.constI(target)], shape);
  }

  /** Collapses every axis before the last into one: [..., k] → [N, k]. */
  flattenLeading(x: Sym): Sym {
    return this.node('Flatten', [x], ['N', x.shape[x.shape.length - 1]!], x.dtype, { axis: x.shape.length - 1 });
  }

  /** Reshape to the runtime shape of `like`. */
  reshapeLike(x: Sym, like: Sym): Sym {
    return this.node('Reshape', [x, this.shapeOf(like)], like.shape);
  }

  shapeOf(x: Sym): Sym {
    return this.node('Shape', [x], [x.shape.length], 'int64');
  }

  /** Broadcasts `x` to the runtime shape of `like`. */
  expandLike(x: Sym, like: Sym): Sym {
    return this.node('Expand', [x, this.shapeOf(like)], like.shape);
  }

  zerosLike(x: Sym): Sym {
    return this.node('ConstantOfShape', [this.shapeOf(x)], x.shape, 'float32');
  }

  reduceSum(x: Sym, axes: number[], keepdims = true): Sym {
    return this.node('ReduceSum', [x, this.constI(axes)], reduced(x.shape, axes, keepdims), x.dtype, { keepdims: keepdims ? 1 : 0 });
  }

  reduceMean(x: Sym, axes: number[]): Sym {
    return this.node('ReduceMean', [x], reduced(x.shape, axes, true), x.dtype, { axes, keepdims: 1 });
  }

  /** Running sum along `axis` (inclusive); `reverse`: from the end. */
  cumsum(x: Sym, axis: number, reverse = false): Sym {
    return this.node('CumSum', [x, this.constI([axis], [])], x.shape, x.dtype, reverse ? { reverse: 1 } : {});
  }
  /** Running sum along `axis` of what comes before each element (0 first). */
  cumsumBefore(x: Sym, axis: number): Sym {
    return this.node('CumSum', [x, this.constI([axis], [])], x.shape, x.dtype, { exclusive: 1 });
  }
  floor(x: Sym): Sym {
    return this.node('Floor', [x], x.shape);
  }
  max(a: Sym, b: Sym): Sym {
    return this.node('Max', [a, b], broadcast(a.shape, b.shape));
  }
  equal(a: Sym, b: Sym): Sym {
    return this.node('Equal', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  greater(a: Sym, b: Sym): Sym {
    return this.node('Greater', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  greaterOrEqual(a: Sym, b: Sym): Sym {
    return this.node('GreaterOrEqual', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  or(a: Sym, b: Sym): Sym {
    return this.node('Or', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  /** The smallest value over `axes`, those axes dropped. */
  reduceMin(x: Sym, axes: number[]): Sym {
    return this.node('ReduceMin', [x], reduced(x.shape, axes, false), x.dtype, { axes, keepdims: 0 });
  }
  /** The largest value over `axes`, those axes dropped. */
  reduceMax(x: Sym, axes: number[]): Sym {
    return this.node('ReduceMax', [x], reduced(x.shape, axes, false), x.dtype, { axes, keepdims: 0 });
  }
  /** Index of the first largest value along `axis`, kept as a size-1 axis. */
  argmax(x: Sym, axis: number): Sym {
    return this.node('ArgMax', [x], reduced(x.shape, [axis], true), 'int64', { axis, keepdims: 1 });
  }
  and(a: Sym, b: Sym): Sym {
    return this.node('And', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  lessOrEqual(a: Sym, b: Sym): Sym {
    return this.node('LessOrEqual', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  less(a: Sym, b: Sym): Sym {
    return this.node('Less', [a, b], broadcast(a.shape, b.shape), 'bool');
  }
  cast(x: Sym, to: DType): Sym {
    return this.node('Cast', [x], x.shape, to, { to: ELEM_TYPE[to] });
  }
  /** cond ? a : b, elementwise. */
  where(cond: Sym, a: Sym, b: Sym): Sym {
    return this.node('Where', [cond, a, b], broadcast(cond.shape, broadcast(a.shape, b.shape)), a.dtype);
  }
  min(a: Sym, b: Sym): Sym {
    return this.node('Min', [a, b], broadcast(a.shape, b.shape));
  }
  /** Appends `after[i]` zeros to the end of axis i. */
  padEnd(x: Sym, after: number[], shape: Dim[]): Sym {
    return this.node('Pad', [x, this.constI([...after.map(() => 0), ...after])], shape);
  }

  /** Pads with zeros, `pads` an int64 [2 × rank] tensor computed in the graph (befores, then afters); `shape` is the result's. */
  pad(x: Sym, pads: Sym, shape: Dim[]): Sym {
    return this.node('Pad', [x, pads], shape);
  }

  softmax(x: Sym): Sym {
    return this.node('Softmax', [x], x.shape, x.dtype, { axis: -1 });
  }
  logSoftmax(x: Sym): Sym {
    return this.node('LogSoftmax', [x], x.shape, x.dtype, { axis: -1 });
  }

  /** table[indices] along `axis`. */
  gather(table: Sym, indices: Sym, axis: number): Sym {
    if (axis < 0) axis += table.shape.length;
    const shape = [...table.shape.slice(0, axis), ...indices.shape, ...table.shape.slice(axis + 1)];
    return this.node('Gather', [table, indices], shape, table.dtype, { axis });
  }

  /** With one batch axis: result[b, n] is x[b, indices[b, n, 0]] (indices [B, N, 1]). */
  gatherRows(x: Sym, indices: Sym): Sym {
    return this.node('GatherND', [x, indices], [x.shape[0]!, ...indices.shape.slice(1, -1), ...x.shape.slice(2)], x.dtype, { batch_dims: 1 });
  }

  gatherElements(x: Sym, indices: Sym, axis: number): Sym {
    return this.node('GatherElements', [x, indices], indices.shape, x.dtype, { axis });
  }

  /** A copy of `into` with `updates` written (or, with reduction 'add', added) at `indices` along `axis`. */
  scatterElements(into: Sym, indices: Sym, updates: Sym, axis: number, reduction: 'none' | 'add' = 'none'): Sym {
    return this.node('ScatterElements', [into, indices, updates], into.shape, into.dtype, { axis, reduction });
  }

  /** The indices where a one-axis `mask` is true ([n]). */
  indicesOf(mask: Sym, n: Dim): Sym {
    return this.reshape(this.node('NonZero', [mask], [1, n], 'int64'), [-1], [n]);
  }

  /** A copy of `into` with its rows (axis 0) `rows` ([n]) replaced by `updates` ([n, ...]). */
  scatterRows(into: Sym, rows: Sym, updates: Sym): Sym {
    return this.node('ScatterND', [into, this.unsqueeze(rows, [1]), updates], into.shape);
  }

  /**
   * ONNX If on a scalar bool: each branch builds a subgraph, reading this graph's values freely, and returns
   * its results; the If's results are the taken branch's, one for one (shapes and types of `then`'s).
   */
  ifElse(cond: Sym, then: (branch: GraphBuilder) => Sym[], otherwise: (branch: GraphBuilder) => Sym[]): Sym[] {
    const at = this.nodes.length;
    const branch = (name: string, build: (b: GraphBuilder) => Sym[]) => {
      const b = new GraphBuilder(`${this.name}.if${at}.${name}`, this);
      const results = build(b);
      results.forEach((r, i) => {
        b.output(r, `${b.name}.result${i}`);
      });
      return { b, results };
    };
    const yes = branch('then', then);
    const no = branch('else', otherwise);
    if (yes.results.length !== no.results.length) throw new Error('If branches must give as many results');
    const outputs = yes.results.map((r) => this.sym(r.shape, r.dtype));
    this.nodes.push({ op: 'If', inputs: [cond], outputs, attrs: { then_branch: yes.b, else_branch: no.b } });
    return outputs;
  }

  /** The k largest values along the last axis and their indices (k: an int64 [1] tensor). */
  topk(x: Sym, k: Sym): [Sym, Sym] {
    const shape = [...x.shape.slice(0, -1), 'k'];
    const values = this.sym(shape, x.dtype);
    const indices = this.sym(shape, 'int64');
    this.nodes.push({ op: 'TopK', inputs: [x, k], outputs: [values, indices], attrs: { axis: -1, largest: 1, sorted: 1 } });
    return [values, indices];
  }

  /** x[starts:ends] along `axes` (int64 [n] tensors each); `shape` is the result's. */
  slice(x: Sym, starts: Sym, ends: Sym, axes: number[], shape: Dim[]): Sym {
    return this.node('Slice', [x, starts, ends, this.constI(axes)], shape, x.dtype);
  }

  concat(xs: Sym[], axis: number, shape: Dim[]): Sym {
    return this.node('Concat', xs, shape, xs[0]!.dtype, { axis });
  }

  unsqueeze(x: Sym, axes: number[]): Sym {
    const shape = [...x.shape];
    for (const a of [...axes].sort((p, q) => p - q)) shape.splice(a, 0, 1);
    return this.node('Unsqueeze', [x, this.constI(axes)], shape);
  }

  // ---- export -----------------------------------------------------------------

  /** Serialises the graph as an ONNX model (opset 17). */
  toOnnx(): Uint8Array {
    const model = onnx.ModelProto.create({ irVersion: 8, producerName: 'loops-mock', opsetImport: [{ domain: '', version: 17 }], graph: this.graphProto() });
    return onnx.ModelProto.encode(model).finish() as Uint8Array;
  }

  private graphProto(): onnxTypes.onnx.IGraphProto {
    const valueInfo = (s: Sym) =>
      onnx.ValueInfoProto.create({
        name: s.name,
        type: { tensorType: { elemType: ELEM_TYPE[s.dtype], shape: { dim: s.shape.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } },
      });
    const attribute = (name: string, v: Attr) =>
      v instanceof GraphBuilder
        ? onnx.AttributeProto.create({ name, type: 5, g: v.graphProto() })
        : typeof v === 'string'
          ? onnx.AttributeProto.create({ name, type: 3, s: Buffer.from(v) })
          : Array.isArray(v)
            ? onnx.AttributeProto.create({ name, type: 7, ints: v })
            : onnx.AttributeProto.create({ name, type: 2, i: v });
    return onnx.GraphProto.create({
      name: this.name,
      node: this.nodes.map((n, i) =>
        onnx.NodeProto.create({
          name: `${this.parent ? `${this.name}.` : ''}${n.op}_${i}`,
          opType: n.op,
          input: n.inputs.map((s) => s.name),
          output: n.outputs.map((s) => s.name),
          attribute: Object.entries(n.attrs).map(([k, v]) => attribute(k, v)),
        }),
      ),
      input: this.inputs.map(valueInfo),
      output: this.outputs.map(valueInfo),
      initializer: this.initializers.map(({ sym, data }) =>
        onnx.TensorProto.create({
          name: sym.name,
          dims: sym.shape as number[],
          dataType: ELEM_TYPE[sym.dtype],
          rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
        }),
      ),
    });
  }
}

/** Numpy-style broadcast of two symbolic shapes. */
export function broadcast(a: Dim[], b: Dim[]): Dim[] {
  const n = Math.max(a.length, b.length);
  const out: Dim[] = [];
  for (let i = 0; i < n; i++) {
    const x = a[a.length - n + i] ?? 1;
    const y = b[b.length - n + i] ?? 1;
    if (x === 1) out.push(y);
    else if (y === 1 || x === y) out.push(x);
    else throw new Error(`cannot broadcast [${a}] with [${b}]`);
  }
  return out;
}

function reduced(shape: Dim[], axes: number[], keepdims: boolean): Dim[] {
  const norm = axes.map((a) => (a < 0 ? a + shape.length : a));
  return keepdims ? shape.map((d, i) => (norm.includes(i) ? 1 : d)) : shape.filter((_, i) => !norm.includes(i));
}
