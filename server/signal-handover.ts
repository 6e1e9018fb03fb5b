/**
 * SIGTERM and SIGINT for a server that starts in two steps: a signal while it starts is noted, and handled once
 * it has (handTo). One listener per signal for the process's life: removing a signal's last listener closes its
 * watcher, and a signal that had arrived while this thread was busy, not yet read from that watcher, was then
 * dropped with it, so a server stopped just as it became ready never stopped.
 */
export interface SignalHandover {
  /** The first signal that came before handTo, if any. */
  early(): string | undefined;
  /** From now on each signal goes to `handler`; one that came before is the caller's to act on (early()). */
  handTo(handler: (signal: string) => void): void;
}

export function holdSignals(signals: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT']): SignalHandover {
  let first: string | undefined;
  let handler = (signal: string) => {
    first ??= signal;
  };
  const listener = (signal: string) => handler(signal);
  for (const s of signals) process.on(s, listener);
  return {
    early: () => first,
    handTo(next) {
      handler = next;
    },
  };
}
