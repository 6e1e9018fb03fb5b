/** The engine's scoring and training passes: forward, top-k and backward, chunks of concurrent calls in shared graph runs. */
import { BatchQueue } from './batch-queue.js';
import { byAdapter, inArrivalOrder, MAX_BATCH_REQUESTS } from './engine-batches.js';
import type { GraphTurns } from './engine-graphs.js';
import {
  cotangentFeed,
  feed,
  fitsOneRun,
  gradNames,
  ownCotangentFeeds,
  scoringUnits,
  sequenceFeeds,
  topkRows,
  unpad,
  type ScoredSequence,
  type ScoringLimits,
  type TopTokens,
} from './feeds.js';
import type { LongSequences } from './long-sequences.js';
import { siteRank, versionKey, type LoraAdapter } from './lora.js';
import { columnsOf, memberGrads } from './side-by-side.js';
import { layerSites, type LoraSite, type ModelDims } from './transformer.js';

/** Padded positions a run of several calls' chunks may hold (see joinable). */
const JOINED_POSITIONS = 4096;
/**
 * Score slots a run of several calls' chunks may hold: 64 rows of Qwen's vocabulary are 39 MB a tensor, and a
 * backward run holds about ten such at its peak. Such runs are heavy (GraphTurns.heavy): their sessions, and
 * that memory, go back once a burst of concurrent steps is over. Larger batches ran no faster.
 */
const JOINED_SCORED = 64;

export interface BackwardResult {
  logprobs: Float32Array[];
  /** Gradient of Σ cotangent·logprob for each LoRA tensor, keyed `<site>.A` / `<site>.B`. */
  grads: Map<string, Float32Array>;
}

/** One chunk of one call's scoring (it fits one graph run), waiting for a run it may share with other runs' chunks. */
interface ScoringRequest {
  kind: 'forward' | 'backward';
  seqs: ScoredSequence[];
  adapter: LoraAdapter;
  /** backward: one per sequence. */
  cotangents?: Float32Array[];
}

/** A chunk's logprobs (one per sequence), and with backward its adapter's gradients (`grad.<site>.A` / `.B`). */
interface ScoringResult {
  logprobs: Float32Array[];
  grads?: Record<string, Float32Array>;
}

/**
 * Scoring and training passes: forward logprobs, top-k, and backward gradients. A call's sequences are cut
 * into chunks that fit one graph run (a longer sequence goes to LongSequences); chunks of concurrent calls
 * share graph runs, each row with its own adapter.
 */
export class Scoring {
  /** Every LoRA gradient's output name, `grad.<site>.A` / `.B` in site order; and the layer sites', which a mixed-adapter run puts side by side. */
  private readonly gradNames: string[];
  private readonly layerSites: LoraSite[];
  private readonly layerGradNames: string[];

  /**
   * Each scoring chunk queues one turn; the first turn to come takes every chunk of its kind waiting by then
   * that fits one run, whatever its run: concurrent runs' training steps share graph runs (each row with its
   * own adapter) rather than wait for each other's.
   */
  private readonly chunks = new BatchQueue<ScoringRequest, ScoringResult>({
    keyOf: (r) => r.kind,
    maxBatch: MAX_BATCH_REQUESTS,
    // One adapter's backward chunks of two calls stay apart: their gradients must.
    fits: (taken, next) =>
      this.batchRuns &&
      !(next.kind === 'backward' && taken.some((r) => versionKey(r.adapter) === versionKey(next.adapter))) &&
      this.joinable([...taken, next].flatMap((r) => r.seqs)),
    run: (batch) => this.scoreTogether(batch),
    schedule: (queue) => void this.graphs.inTurn(() => queue.runBatch()),
  });

  constructor(
    private readonly graphs: GraphTurns,
    private readonly long: LongSequences,
    private readonly dims: ModelDims,
    private readonly sites: LoraSite[],
    /** What one scoring run may hold; a sequence over it is scored in blocks (LongSequences). */
    private readonly limits: ScoringLimits,
    /** Attention scores one run may hold per layer, in floats. */
    private readonly attentionFloats: number,
    private readonly batchRuns: boolean,
  ) {
    this.gradNames = gradNames(sites);
    this.layerSites = layerSites(sites);
    this.layerGradNames = gradNames(this.layerSites);
  }

  /** Logprob of each target token, per sequence. */
  async forward(seqs: ScoredSequence[], adapter: LoraAdapter): Promise<Float32Array[]> {
    const out: Float32Array[] = [];
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      if (long) {
        out.push((await this.long.score(chunk[0]!, adapter, 'forward')).logprobs);
        continue;
      }
      // Nothing scored (a lone token, or every target -100): every logprob is 0 and no graph needs to run.
      if (chunk.every((s) => s.scored?.length === 0)) {
        out.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        continue;
      }
      out.push(...(await this.chunks.push({ kind: 'forward', seqs: chunk, adapter })).logprobs);
    }
    return out;
  }

  /** The target logprobs and the k most likely tokens at each scored position (ModelEngine.topk). */
  async topk(seqs: ScoredSequence[], adapter: LoraAdapter, k: number): Promise<{ logprobs: Float32Array[]; top: TopTokens[][] }> {
    const logprobs: Float32Array[] = [];
    const top: TopTokens[][] = [];
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      if (long) {
        const scored = await this.long.score(chunk[0]!, adapter, 'topk', k);
        logprobs.push(scored.logprobs);
        top.push(scored.top);
        continue;
      }
      const feeds = { ...sequenceFeeds(this.dims, chunk), k: feed('int64', BigInt64Array.from([BigInt(k)]), [1]) };
      const result = await this.graphs.run('topk', feeds, ['logprobs', 'topk_values', 'topk_indices'], adapter);
      logprobs.push(...unpad(result.logprobs!, chunk));
      top.push(...topkRows(result.topk_values!, result.topk_indices! as unknown as BigInt64Array, chunk, k));
    }
    return { logprobs, top };
  }

  /** Logprobs and the gradient of Σ_t cotangent_t·logprob_t for every LoRA tensor, summed over all sequences. */
  async backward(seqs: ScoredSequence[], adapter: LoraAdapter, cotangents: Float32Array[]): Promise<BackwardResult> {
    const grads = new Map<string, Float32Array>();
    const logprobs: Float32Array[] = [];
    let start = 0;
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      const own = cotangents.slice(start, start + chunk.length);
      start += chunk.length;
      if (long) {
        logprobs.push(await this.long.backward(chunk[0]!, adapter, own[0]!, (result) => this.addGrads(grads, result)));
        continue;
      }
      if (chunk.every((s) => s.scored?.length === 0)) {
        // Nothing scored: logprobs 0 and no gradient from this chunk.
        logprobs.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        continue;
      }
      const result = await this.chunks.push({ kind: 'backward', seqs: chunk, adapter, cotangents: own });
      logprobs.push(...result.logprobs);
      this.addGrads(grads, result.grads!);
    }
    for (const site of this.sites) {
      const r = siteRank(adapter.tensors.get(site.key)!, site);
      if (!grads.has(`${site.key}.A`)) grads.set(`${site.key}.A`, new Float32Array(site.inDim * r));
      if (!grads.has(`${site.key}.B`)) grads.set(`${site.key}.B`, new Float32Array(r * site.outDim));
    }
    return { logprobs, grads };
  }

  /**
   * Scoring chunks of one kind in one graph run, from a turn already taken. One adapter version (forward
   * chunks of several calls may share one): its graph, as a call alone would run it. Several: the
   * mixed-adapter graph, each adapter's rows together, its gradients taken back apart.
   */
  private async scoreTogether(arrived: ScoringRequest[]): Promise<ScoringResult[]> {
    // Each adapter version once (a backward batch never holds one twice: see fits), and each row's.
    const { batch, adapters, slots, rowAdapters } = byAdapter(arrived, (r) => r.seqs.length);
    const { kind } = batch[0]!;
    const seqs = batch.flatMap((r) => r.seqs);
    const feeds = sequenceFeeds(this.dims, seqs);
    if (kind === 'backward') {
      const T = Math.max(...seqs.map((s) => s.tokens.length));
      Object.assign(
        feeds,
        {
          cotangent: cotangentFeed(
            seqs,
            batch.flatMap((r) => r.cotangents!),
          ),
        },
        ownCotangentFeeds(this.dims, seqs.length, T),
      );
    }
    const grads = !rowAdapters ? this.gradNames : [...this.layerGradNames, ...adapters.flatMap((_, j) => [`grad.lm_head.A.${j}`, `grad.lm_head.B.${j}`])];
    const outputs = kind === 'backward' ? ['logprobs', ...grads] : ['logprobs'];
    const result = await this.graphs.runNow(kind, feeds, outputs, adapters, rowAdapters);
    // Every layer site has the adapter's rank (SideBySide checks): one site's ranks place every site's columns.
    const columns =
      kind === 'backward' && rowAdapters ? columnsOf(adapters.map((a) => siteRank(a.tensors.get(this.layerSites[0]!.key)!, this.layerSites[0]!))) : null;
    const logprobs = unpad(result.logprobs!, seqs);
    let at = 0;
    const results = batch.map((r, i): ScoringResult => {
      const own = logprobs.slice(at, at + r.seqs.length);
      at += r.seqs.length;
      if (kind === 'forward') return { logprobs: own };
      if (!rowAdapters) return { logprobs: own, grads: result };
      const j = slots[i]!;
      const ownGrads = memberGrads(this.layerSites, columns!, j, result);
      ownGrads['grad.lm_head.A'] = result[`grad.lm_head.A.${j}`]!;
      ownGrads['grad.lm_head.B'] = result[`grad.lm_head.B.${j}`]!;
      return { logprobs: own, grads: ownGrads };
    });
    return inArrivalOrder(arrived, batch, results);
  }

  /**
   * Whether chunks of different calls may share one run: short sequences only (their attention is small,
   * so more padded positions than one call's chunk may hold), and at most JOINED_SCORED score slots, about
   * where a vocabulary-sized pass stops getting cheaper per row; one call's own chunk may hold more.
   */
  private joinable(seqs: ScoredSequence[]): boolean {
    const T = Math.max(...seqs.map((s) => s.tokens.length));
    const attention = seqs.length * this.dims.heads * T * T;
    const limits = { positions: JOINED_POSITIONS, scored: Math.min(this.limits.scored, JOINED_SCORED) };
    return attention <= this.attentionFloats && fitsOneRun(seqs, limits);
  }

  /** Adds a run's LoRA gradients into `grads` (by `<site>.A` / `<site>.B`). */
  private addGrads(grads: Map<string, Float32Array>, result: Record<string, Float32Array>): void {
    for (const name of this.gradNames) {
      const key = name.slice('grad.'.length);
      const g = result[name]!;
      const acc = grads.get(key);
      if (!acc) grads.set(key, g);
      else for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!;
    }
  }
}
