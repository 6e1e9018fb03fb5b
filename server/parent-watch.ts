/**
 * Calls `onGone` once the process that started this one is gone, however it went (SIGKILL included): the
 * kernel then hands this process to another parent (init or a subreaper), so its parent process id changes.
 * Polled, since no signal reaches a child when its parent dies (Linux's PR_SET_PDEATHSIG is not in Node).
 */
export function watchParent(onGone: () => void, intervalMs = 200): () => void {
  const parent = process.ppid;
  const timer = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(timer);
    onGone();
  }, intervalMs);
  // The watch alone never keeps the process alive.
  timer.unref();
  return () => clearInterval(timer);
}
