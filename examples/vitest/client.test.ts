import { expect, inject, it } from 'vitest';

it('reaches the server the global setup started', async () => {
  const env = inject('loopsEnv');
  const res = await fetch(`${env.LOOPS_BASE_URL}/v1/loops/capabilities`, {
    headers: { authorization: `Bearer ${env.BASETEN_API_KEY}` },
  });
  expect(res.status).toBe(200);
});
