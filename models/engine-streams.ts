/** An engine's sampling streams: those decoding, which a decode batch waits for, and the clients about to return, which a prefill waits for. */

/** How long a decode batch waits for sampling streams still choosing their tokens, and a prefill for returning clients. */
export const BATCH_WAIT_MS = 3;
/** A sampling stream that ended this recently counts as a client about to send its next prompt. */
const RETURN_WINDOW_MS = 10;

/**
 * An engine's sampling streams: how many are in their decode loop (a decode batch waits briefly for each of
 * them to send its next step), and when the ended ones ended, oldest first, less one for each prompt that came
 * since: each is likely a client about to send its next prompt (an RL loop's samplers finish a step together
 * and come back together), which a prefill waits for. Which prompt is whose is not known: a stream whose client
 * never came back would make the next lone client wait for itself, so a wait that runs out forgets them all.
 */
export class SamplingStreams {
  private open = 0;
  private readonly ended: number[] = [];

  /** Streams in their decode loop now. */
  get decoding(): number {
    return this.open;
  }

  /** Clients whose streams ended within the return window and whose next prompt has not come yet. */
  returning(): number {
    const since = performance.now() - RETURN_WINDOW_MS;
    while (this.ended.length && this.ended[0]! < since) this.ended.shift();
    return this.ended.length;
  }

  /** A prompt came: it is one of the clients counted as returning (stale ones dropped first, so it takes a fresh one). */
  promptArrived(): void {
    if (this.returning()) this.ended.shift();
  }

  /** A prefill's wait ran out with fewer prompts than expected: the clients counted as returning did not come. */
  forgetReturning(): void {
    this.ended.length = 0;
  }

  /** Marks a stream as decoding until the returned function is called; then it counts as a returning client. */
  openStream(): () => void {
    this.open++;
    let open = true;
    return () => {
      if (open) {
        open = false;
        this.open--;
        this.ended.push(performance.now());
      }
    };
  }
}
