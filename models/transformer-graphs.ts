/**
 * The graphs of the tiny transformer (transformer.ts), as onnxruntime runs them: built from the model's shapes
 * with the graph builder. A module of its own so that the server's thread, which needs the shapes and weights
 * alone, does not load the builder and its protobuf code at start (~25 ms): the engine's worker builds them.
 */
import { drawNucleusTokens, drawTokens, drawTopTokens, mostLikely } from './draw-graphs.js';
import { backprop } from './graph/autodiff.js';
import { GraphBuilder, type Sym } from './graph/builder.js';
import { DECODE_KINDS, MIXED_SLOTS, NORM_EPS, baseWeightShapes, layerSites, loraSites, type GraphKind, type ModelDims } from './transformer.js';

export interface BuiltGraph {
  onnx: Uint8Array;
  /** LoRA input names in site order: `lora.<key>.A`, `lora.<key>.B`. */
  loraInputs: string[];
}

/**
 * Builds one of the graphs. Each attends over P cached positions (past_k/past_v, possibly none) before its
 * own T, so a long sequence can be scored block by block:
 * - forward: logprob of each target token, [B, T], and the block's own keys and values;
 * - backward: the same logprobs, and the gradient of Σ c·logprob (plus cot_k/cot_v on the block's keys and
 *   values) for every LoRA tensor and for the cached keys and values;
 * - decode: next-token logits of the last position, with a KV cache in and out;
 * - draw: decode, with the next tokens drawn inside the graph (drawTokens);
 * - draw_top: decode, with the next tokens drawn inside the graph among the k most likely, cut again to
 *   each row's top_p of their mass (drawTopTokens);
 * - draw_nucleus: decode, with the next tokens drawn inside the graph from each row's top_p nucleus
 *   (drawNucleusTokens), each draw tested on its own;
 * - draw_nucleus_wide: the same for a prompt's many draws (more than NUCLEUS_TESTS_UP_TO): each row's
 *   nucleus found once;
 * - greedy: decode, with the most likely next token chosen inside the graph;
 * - topk: the forward logprobs, and the k most likely tokens at every scored position (prompt top-k, a
 *   training pass's `top_k_logprobs`).
 */
export interface GraphOptions {
  /**
   * Score through W + (scale·A)·B built once per run, rather than x·W + (scale·x·A)·B: fewer passes over
   * [positions × vocab] for many positions, more work for few (the [d × vocab] sum). The engine picks per run.
   */
  mergedUnembedding?: boolean;
  /** Decode graphs: the merged unembedding as a constant of the graph ([d, vocab]), which onnxruntime packs once. */
  packedUnembedding?: Float32Array;
  /**
   * Rows of several adapters in one run (different runs' training, or samplers' decode steps, batched), each
   * adapter's rows contiguous. The layer sites take the adapters' tensors side by side along the rank (A
   * [in, Σr], B [Σr, out]) and each row's scale over its adapter's columns in `lora_rows` ([B, 1, Σr], 0 over
   * the others'), so x·A·B is each row's own update and each adapter's gradient sums its own rows only. The
   * unembedding, whose B is vocabulary-wide, takes each adapter apart (`lora.lm_head.A.<slot>`, `.B.<slot>`,
   * `slot_scale`) and applies it to its own rows (`slot_rows`: slot j holds rows [j, j + 1) of it), so no
   * row pays for other adapters' ranks over the vocabulary. Neither merged nor packed unembedding applies.
   */
  mixedAdapters?: boolean;
}

export function buildGraph(kind: GraphKind, dims: ModelDims, options: GraphOptions = {}): BuiltGraph {
  const g = new GraphBuilder(`loops-mock-${kind}`);
  const { dModel: d, heads } = dims;
  const hd = d / heads;
  const decode = DECODE_KINDS.includes(kind);

  const tokens = g.input('tokens', 'int64', ['B', 'T']);
  // Every graph attends over cached positions (P of them, possibly none) and its own: K = P + T keys.
  const attnBias = g.input('attn_bias', 'float32', ['B', 1, 'T', 'K']);
  const ropeCos = g.unsqueeze(g.input('rope_cos', 'float32', ['B', 'T', hd]), [2]);
  const ropeSin = g.unsqueeze(g.input('rope_sin', 'float32', ['B', 'T', hd]), [2]);
  const mixed = options.mixedAdapters === true;
  if (mixed && (options.mergedUnembedding || options.packedUnembedding)) throw new Error('a mixed-adapter graph has no merged unembedding');
  const scale = mixed ? null : g.input('lora_scale', 'float32', []);
  const base = new Map<string, Sym>();
  for (const w of baseWeightShapes(dims)) base.set(w.name, g.input(`base.${w.name}`, 'float32', w.shape));
  const lora = new Map<string, { A: Sym; B: Sym }>();
  // One scale for every site: the run's, or in a mixed run each row's over its own adapter's columns.
  const loraScale = scale ?? g.input('lora_rows', 'float32', ['B', 1, 'r']);
  for (const site of mixed ? layerSites(loraSites(dims)) : loraSites(dims)) {
    // Sites with a rank cap may have a rank of their own: a dimension name of their own.
    const r = site.maxRank === undefined ? 'r' : `r_${site.key}`;
    lora.set(site.key, {
      A: g.input(`lora.${site.key}.A`, 'float32', [site.inDim, r]),
      B: g.input(`lora.${site.key}.B`, 'float32', [r, site.outDim]),
    });
  }
  // A mixed run's unembedding LoRA: each slot's adapter on its own rows.
  const slots = mixed
    ? Array.from({ length: MIXED_SLOTS }, (_, j) => ({
        A: g.input(`lora.lm_head.A.${j}`, 'float32', [d, `r_lm_head_${j}`]),
        B: g.input(`lora.lm_head.B.${j}`, 'float32', [`r_lm_head_${j}`, dims.vocab]),
      }))
    : [];
  const slotRows = mixed ? g.input('slot_rows', 'int64', [MIXED_SLOTS + 1]) : null;
  const slotScale = mixed ? g.input('slot_scale', 'float32', [MIXED_SLOTS]) : null;

  const W = (name: string) => base.get(name)!;
  /** x·W + (scale·x·A)·B: the base projection plus its LoRA update (scaled at rank width, not output width). */
  const proj = (x: Sym, key: string, weight: Sym) => {
    const { A, B } = lora.get(key)!;
    return g.add(g.matmul(x, weight), g.matmul(g.mul(g.matmul(x, A), loraScale), B));
  };
  /** x·W_embed plus, per slot, its adapter's (s·x·A)·B on its own rows, the slots' updates stacked back in row order. */
  const unembedSlots = (x: Sym) => {
    // Slot j's rows run from bound j to bound j + 1.
    const bounds = Array.from({ length: MIXED_SLOTS + 1 }, (_, j) => g.slice(slotRows!, g.constI([j]), g.constI([j + 1]), [0], [1]));
    const updates = slots.map(({ A, B }, j) => {
      const rows = g.slice(x, bounds[j]!, bounds[j + 1]!, [0], [`n_${j}`, ...x.shape.slice(1)]);
      return g.matmul(g.mul(g.matmul(rows, A), g.gather(slotScale!, g.constI([j]), 0)), B);
    });
    return g.add(g.matmul(x, W('embed_t')), g.concat(updates, 0, [...x.shape.slice(0, -1), dims.vocab]));
  };
  const unembed = (x: Sym) => (mixed ? unembedSlots(x) : proj(x, 'lm_head', W('embed_t')));
  /** The unembedding with LoRA merged into the weight first: one product, no extra pass over [positions × vocab]. */
  const unembedMerged = (x: Sym) => {
    const { A, B } = lora.get('lm_head')!;
    return g.matmul(x, g.add(W('embed_t'), g.matmul(g.mul(A, loraScale), B)));
  };
  const rmsnorm = (x: Sym, weight: Sym) => g.mul(g.div(x, g.sqrt(g.add(g.reduceMean(g.mul(x, x), [-1]), g.scalar(NORM_EPS)))), weight);
  // rotate_half as a constant matrix: x·R = concat(-x₂, x₁), so rotary needs no slicing.
  const R = new Float32Array(hd * hd);
  for (let j = 0; j < hd / 2; j++) {
    R[(j + hd / 2) * hd + j] = -1;
    R[j * hd + j + hd / 2] = 1;
  }
  const rotate = g.constF(R, [hd, hd]);
  const rope = (x: Sym) => g.add(g.mul(x, ropeCos), g.mul(g.matmul(x, rotate), ropeSin));
  const splitHeads = (x: Sym) => g.reshape(x, [0, 0, heads, hd], ['B', 'T', heads, hd]);

  // Embedding: columns of the transposed table, back to [B, T, d].
  let x = g.transpose(g.gather(W('embed_t'), tokens, 1), [1, 2, 0]);
  const presents: Sym[] = [];
  /** The block's own keys and values per layer, and the cached ones they follow (scoring graphs: see LongSequences in long-sequences.ts). */
  const own: { k: Sym; v: Sym; pastK: Sym; pastV: Sym }[] = [];
  for (let l = 0; l < dims.layers; l++) {
    const p = `layers.${l}`;
    const h = rmsnorm(x, W(`${p}.attn_norm`));
    const q = g.transpose(rope(splitHeads(proj(h, `${p}.q_proj`, W(`${p}.q_proj`)))), [0, 2, 1, 3]);
    let k = g.transpose(rope(splitHeads(proj(h, `${p}.k_proj`, W(`${p}.k_proj`)))), [0, 2, 1, 3]);
    let v = g.transpose(splitHeads(proj(h, `${p}.v_proj`, W(`${p}.v_proj`))), [0, 2, 1, 3]);
    const pastK = g.input(`past_k.${l}`, 'float32', ['B', heads, 'P', hd]);
    const pastV = g.input(`past_v.${l}`, 'float32', ['B', heads, 'P', hd]);
    own.push({ k, v, pastK, pastV });
    k = g.concat([pastK, k], 2, ['B', heads, 'K', hd]);
    v = g.concat([pastV, v], 2, ['B', heads, 'K', hd]);
    if (decode) presents.push(k, v);
    const scores = g.add(g.mul(g.matmul(q, g.transposeLast(k)), g.scalar(1 / Math.sqrt(hd))), attnBias);
    const attn = g.matmul(g.softmax(scores), v);
    const merged = g.reshape(g.transpose(attn, [0, 2, 1, 3]), [0, 0, d], ['B', 'T', d]);
    x = g.add(x, proj(merged, `${p}.o_proj`, W(`${p}.o_proj`)));
    const m = rmsnorm(x, W(`${p}.mlp_norm`));
    const gate = proj(m, `${p}.gate_proj`, W(`${p}.gate_proj`));
    const up = proj(m, `${p}.up_proj`, W(`${p}.up_proj`));
    x = g.add(x, proj(g.mul(g.mul(gate, g.sigmoid(gate)), up), `${p}.down_proj`, W(`${p}.down_proj`)));
  }
  const final = rmsnorm(x, W('final_norm'));

  if (decode) {
    // Only the last position is decoded: gather it before the unembedding. Log-softmax and its exp (at the
    // request's temperature) are computed here, so the sampler makes no pass over the vocabulary with exp.
    // The temperature scales the last hidden state rather than the logits: the same product, one pass over
    // [rows × vocab] fewer.
    // Each row's last real position (prompts of different lengths share a run, right-padded).
    const last = g.mul(g.gatherRows(final, g.input('last_index', 'int64', ['B', 1])), g.input('inv_temperature', 'float32', ['B', 1]));
    // With a merged unembedding the caller feeds W + scale·A·B, built once per adapter version (mergeGraph).
    const logits = options.packedUnembedding
      ? g.matmul(last, g.constF(options.packedUnembedding, [d, dims.vocab]))
      : options.mergedUnembedding
        ? g.matmul(last, g.input('lm_head_merged', 'float32', [d, dims.vocab]))
        : unembed(last);
    if (kind === 'draw' || kind === 'draw_top' || kind === 'draw_nucleus' || kind === 'draw_nucleus_wide' || kind === 'greedy') {
      const u = () => g.input('u', 'float32', ['B', 'N']);
      const { token, logprob } =
        kind === 'draw'
          ? drawTokens(g, logits, u(), dims.vocab)
          : kind === 'draw_top'
            ? drawTopTokens(g, logits, u(), g.input('k', 'int64', [1]), g.input('top_p', 'float32', ['B', 1]))
            : kind === 'draw_nucleus' || kind === 'draw_nucleus_wide'
              ? drawNucleusTokens(
                  g,
                  logits,
                  u(),
                  g.input('u_retry', 'float32', ['B', 'N']),
                  g.input('top_p', 'float32', ['B', 1]),
                  dims.vocab,
                  kind === 'draw_nucleus_wide',
                )
              : mostLikely(g, logits);
      g.output(token, 'token');
      g.output(logprob, 'token_logprob');
    } else {
      const logprobs = g.logSoftmax(logits);
      g.output(logprobs, 'logprobs');
      g.output(g.exp(logprobs), 'probs');
    }
    presents.forEach((s, i) => {
      g.output(s, `present_${i % 2 === 0 ? 'k' : 'v'}.${Math.floor(i / 2)}`);
    });
  } else {
    // Only the scored positions (those with a target that counts) reach the unembedding: with prompts
    // masked out, that is most of the cost of a vocabulary-sized output saved.
    const scored = g.gatherElements(final, g.input('score_index', 'int64', ['B', 'S', d]), 1);
    const logits = options.mergedUnembedding ? unembedMerged(scored) : unembed(scored);
    const targets = g.input('targets', 'int64', ['B', 'S']);
    const all = g.logSoftmax(logits);
    const logprobs = g.reshape(g.gatherElements(all, g.unsqueeze(targets, [2]), 2), [0, 0], ['B', 'S']);
    g.output(logprobs, 'logprobs');
    // A block of a long sequence hands its keys and values on to the next block (forward and topk).
    if (kind !== 'backward')
      own.forEach(({ k, v }, l) => {
        g.output(k, `block_k.${l}`);
        g.output(v, `block_v.${l}`);
      });
    if (kind === 'topk') {
      const [values, indices] = g.topk(all, g.input('k', 'int64', [1]));
      g.output(values, 'topk_values');
      g.output(indices, 'topk_indices');
    }
    if (kind === 'backward') {
      // Σ c·logprob over this block, plus what later blocks' losses owe to this block's keys and values
      // (cot_k, cot_v: zeros for a sequence scored in one run). Out come the LoRA gradients and what
      // this block's losses owe to the cached keys and values of earlier blocks.
      const cotangent = g.input('cotangent', 'float32', ['B', 'S']);
      const seeds: [Sym, Sym][] = [[logprobs, cotangent]];
      own.forEach(({ k, v }, l) => {
        seeds.push([k, g.input(`cot_k.${l}`, 'float32', ['B', heads, 'T', hd])], [v, g.input(`cot_v.${l}`, 'float32', ['B', heads, 'T', hd])]);
      });
      const past = own.flatMap(({ pastK, pastV }) => [pastK, pastV]);
      const wrt = [...[...lora.values(), ...slots].flatMap(({ A, B }) => [A, B]), ...past];
      const grads = backprop(g, seeds, wrt);
      for (const [site, { A, B }] of lora) {
        g.output(grads.get(A)!, `grad.${site}.A`);
        g.output(grads.get(B)!, `grad.${site}.B`);
      }
      slots.forEach(({ A, B }, j) => {
        g.output(grads.get(A)!, `grad.lm_head.A.${j}`);
        g.output(grads.get(B)!, `grad.lm_head.B.${j}`);
      });
      own.forEach(({ pastK, pastV }, l) => {
        g.output(grads.get(pastK)!, `grad.past_k.${l}`);
        g.output(grads.get(pastV)!, `grad.past_v.${l}`);
      });
    }
  }
  return { onnx: g.toOnnx(), loraInputs: [...lora.keys()].flatMap((k) => [`lora.${k}.A`, `lora.${k}.B`]) };
}

/** W + scale·A·B for the unembedding: what a decode graph with a merged unembedding takes as `lm_head_merged`. */
export function buildMergeGraph(dims: ModelDims): Uint8Array {
  const g = new GraphBuilder('loops-mock-merge');
  const W = g.input('base.embed_t', 'float32', [dims.dModel, dims.vocab]);
  const A = g.input('lora.lm_head.A', 'float32', [dims.dModel, 'r']);
  const B = g.input('lora.lm_head.B', 'float32', ['r', dims.vocab]);
  const scale = g.input('lora_scale', 'float32', []);
  g.output(g.add(W, g.matmul(g.mul(A, scale), B)), 'lm_head_merged');
  return g.toOnnx();
}
