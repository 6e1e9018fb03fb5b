import { expect, it } from 'vitest';
import { ManualClock, startServer } from 'loops-mock';

// A server of the test's own, on a clock the test moves: an hour passes in a millisecond.
it('stops an idle run after its scale_down_delay_seconds', async () => {
  const clock = new ManualClock();
  const server = await startServer({ port: 0, clock, logLevel: 'silent' });
  try {
    const post = async (path: string, body?: unknown) => {
      const res = await fetch(`${server.url}${path}`, {
        method: 'POST',
        headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return res.json() as Promise<any>;
    };
    const { session } = await post('/v1/loops/sessions');
    const { run } = await post('/v1/loops/runs', { session_id: session.id, base_model: 'Qwen/Qwen3.5-2B', scale_down_delay_seconds: 3600 });
    clock.advance(3_600_000);
    const res = await fetch(`${server.url}/v1/loops/runs/${run.id}`, { headers: { authorization: `Bearer ${server.apiKey}` } });
    expect(((await res.json()) as any).run.status.name).toBe('INACTIVE');
  } finally {
    await server.close();
  }
});
