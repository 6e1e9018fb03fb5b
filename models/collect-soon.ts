/**
 * Collections of V8's garbage soon after memory is let go: megabytes of buffers (a deactivated run's
 * adapter and optimizer state, a long sequence's blocks) otherwise wait for V8's next collection, which an
 * idle process may not run for minutes. Only where the runtime exposes gc (the loops-mock command starts
 * Node with --expose-gc); elsewhere the returned function does nothing.
 *
 * The returned function is called at each release. A collection runs `delayMs` after a release, and never
 * sooner than `minGapMs` after the previous one: while releases keep coming (a sustained load), one every
 * `minGapMs` rather than one each `delayMs`; once they stop, one more.
 */
export function collectorAfterReleases(delayMs = 200, minGapMs = 1000): () => void {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return () => undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let last = -Infinity;
  return () => {
    if (timer) return;
    timer = setTimeout(
      () => {
        timer = undefined;
        last = performance.now();
        gc();
      },
      Math.max(delayMs, last + minGapMs - performance.now()),
    );
    // Never what keeps the process (or a worker) alive.
    timer.unref?.();
  };
}
