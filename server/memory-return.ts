/**
 * A deactivated run leaves megabytes of buffers (its adapter, gradients and
 * optimizer state), and a long sequence its blocks' feeds and results, to
 * V8's next collection, which an idle server may not run for minutes: their
 * memory stays resident until then. Where the process was started with
 * --expose-gc (the loops-mock command is, see server/cli.ts), one collection
 * runs shortly after a burst of such releases.
 */
export function collectorAfterReleases(delayMs = 200): () => void {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return () => undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  return () => {
    // After the last release of a burst: one collection, not one every delayMs while releases keep coming.
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      timer = undefined;
      gc();
    }, delayMs);
    // Never what keeps the process alive.
    timer.unref();
  };
}
