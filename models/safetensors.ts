/** The safetensors format: an 8-byte little-endian header length, a JSON header, then raw little-endian tensor bytes. */
export interface NamedTensor {
  shape: number[];
  data: Float32Array;
}

export function encodeSafetensors(tensors: Map<string, NamedTensor>, metadata: Record<string, string> = {}): Uint8Array {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const [name, t] of tensors) {
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = JSON.stringify(header);
  // Pad the header with spaces so tensor data starts 8-byte aligned.
  json += ' '.repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const headerBytes = Buffer.from(json, 'utf8');
  const out = new Uint8Array(8 + headerBytes.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerBytes.length), true);
  out.set(headerBytes, 8);
  let at = 8 + headerBytes.length;
  for (const t of tensors.values()) {
    out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at);
    at += t.data.byteLength;
  }
  return out;
}

export function decodeSafetensors(bytes: Uint8Array): { tensors: Map<string, NamedTensor>; metadata: Record<string, string> } {
  if (bytes.length < 8) throw new Error('not a safetensors file: shorter than its header length');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  if (8 + headerLength > bytes.length) throw new Error('not a safetensors file: header runs past the end');
  const header = JSON.parse(Buffer.from(bytes.subarray(8, 8 + headerLength)).toString('utf8')) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const base = 8 + headerLength;
  const tensors = new Map<string, NamedTensor>();
  let metadata: Record<string, string> = {};
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = entry as unknown as Record<string, string>;
      continue;
    }
    if (entry.dtype !== 'F32') throw new Error(`tensor ${name} is ${entry.dtype}; loops-mock reads F32 tensors`);
    const [start, end] = entry.data_offsets;
    const count = entry.shape.reduce((p, n) => p * n, 1);
    if (end - start !== count * 4 || base + end > bytes.length) throw new Error(`tensor ${name}: its byte range does not match its shape`);
    // Copy: the file buffer may not be 4-byte aligned.
    const data = new Float32Array(count);
    new Uint8Array(data.buffer).set(bytes.subarray(base + start, base + end));
    tensors.set(name, { shape: entry.shape, data });
  }
  return { tensors, metadata };
}
