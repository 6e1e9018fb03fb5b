/** `--device cuda` on a machine whose onnxruntime-node has no CUDA execution provider. */
export class DeviceUnavailableError extends Error {
  constructor(cause: unknown) {
    super(
      'The CUDA execution provider is not available to onnxruntime-node here: its CUDA binaries are not installed ' +
        "(this project's .npmrc skips their download, and they need CUDA 12 and cuDNN on the machine). On a machine that has them, run " +
        '`ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules/onnxruntime-node/script/install.js`, or use --device cpu. ' +
        `(onnxruntime said: ${String((cause as Error)?.message ?? cause).split('\n')[0]})`,
    );
    this.name = 'DeviceUnavailableError';
  }
}
