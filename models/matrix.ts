/** A row-major [rows, cols] matrix as [cols, rows]: the engine keeps x·W layouts, Hugging Face files W as [out, in]. */
export function transpose(data: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(data.length);
  // In blocks of columns, so that the output rows being written stay in cache (lm_head's B is rank × 151k).
  const BLOCK = 256;
  for (let j0 = 0; j0 < cols; j0 += BLOCK) {
    const j1 = Math.min(cols, j0 + BLOCK);
    for (let i = 0; i < rows; i++) for (let j = j0; j < j1; j++) out[j * rows + i] = data[i * cols + j]!;
  }
  return out;
}
