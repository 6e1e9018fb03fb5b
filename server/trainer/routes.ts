import type { FastifyInstance, FastifyReply } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import type { RunRecord } from '../core/records.js';
import type { TrainerRequest } from '../core/trainers.js';
import { sendError } from '../http/errors.js';
import { faultOf } from '../http/fault-hook.js';
import { OperationFailure, type Operation } from '../core/operations.js';
import { planeTargets } from '../http/plane.js';
import { HealthResponse, OperationIdResponse, OperationResponse, PolicyVersionResponse, TRAINER_BODIES, TRAINER_OPS, type TrainerOp } from '../wire/trainer.js';

const RunParams = Type.Object({ run_id: Type.String() });
const OperationParams = Type.Object({ run_id: Type.String(), operation_id: Type.String() });

/** The trainer of each run at `run.base_url` = `{public_url}/trainer/{run_id}`: submit-then-poll operations. */
export function trainerRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const target = planeTargets(appIn, core, 'trainer');
  const tags = ['trainer'];
  const activeRun = (run: RunRecord) => {
    if (run.status !== 'ACTIVE') {
      throw new LoopsError(
        'conflict',
        `Run ${run.id} is INACTIVE (${run.inactive_reason ?? 'stopped'}): its trainer no longer takes requests. Its checkpoints remain; create a new run (path = a saved state) to continue.`,
        { type_detail: 'run_inactive', run_id: run.id },
      );
    }
    return run;
  };

  const submitRoute = <O extends TrainerOp>(op: O) => {
    app.post(
      `/trainer/:run_id/${op}`,
      {
        schema: {
          tags,
          summary: `Submit ${op}; poll GET /trainer/{run_id}/operations/{operation_id} for its result`,
          params: RunParams,
          body: TRAINER_BODIES[op],
          response: { 200: OperationIdResponse },
        },
      },
      (req) => {
        const { record, caller } = target(req);
        const run = activeRun(record);
        const key = req.headers['idempotency-key'];
        const principal = caller ?? ownerOf(core, run);
        // Training changes the run: a key of another team of its organisation may read it, not train it.
        core.accounts.requireMember(principal, run.team_id, `${op} on run ${run.id}`);
        const fault = faultOf(req);
        const injected =
          fault?.type === 'fail_operation'
            ? new OperationFailure(fault.error_class, fault.message ?? `${op} failed (injected by a loops-mock fault rule).`)
            : undefined;
        // The schema of this op validated the body, so it is this op's body.
        const request = { op, body: req.body } as TrainerRequest;
        const operation = core.trainers.submit(principal, run, request, Array.isArray(key) ? key[0] : key, injected);
        return { operation_id: operation.id };
      },
    );
  };
  for (const op of TRAINER_OPS) submitRoute(op);

  app.get(
    '/trainer/:run_id/operations/:operation_id',
    {
      schema: {
        tags,
        summary: 'Long-poll an operation: 200 done or error, 408 when the window (--long-poll-ms) passes first, 404 unknown or expired, 503 shutting down',
        params: OperationParams,
        response: { 200: OperationResponse },
      },
    },
    async (req, reply) => {
      const { record } = target(req);
      const operations = core.operations;
      const op = operations.get(record.id, req.params.operation_id);
      if (!op)
        return sendError(
          reply,
          404,
          'not_found',
          `No operation '${req.params.operation_id}' on run ${record.id}: unknown, or its result expired. Resubmit with the same Idempotency-Key.`,
          { field: 'operation_id' },
        );
      if (operations.isClosed) return shuttingDown(reply, op);
      operations.notePoll(op);
      const windowMs = core.settings.longPollMs;
      if (faultOf(req)?.type === 'hold_poll') {
        // A fault rule holds this poll for its whole window, done or not.
        const signal = core.stopSignal;
        const ended = await new Promise<'window' | 'gone' | 'stopping'>((resolve) => {
          const timer = core.clock.setTimer(windowMs, () => finish('window'));
          const onStop = () => finish('stopping');
          function finish(how: 'window' | 'gone' | 'stopping') {
            timer.cancel();
            signal.removeEventListener('abort', onStop);
            resolve(how);
          }
          if (signal.aborted) return finish('stopping');
          signal.addEventListener('abort', onStop);
          reply.raw.once('close', () => finish('gone'));
        });
        if (ended === 'stopping') return shuttingDown(reply, op);
        if (ended === 'window')
          return sendError(
            reply,
            408,
            'operation_pending',
            `Operation ${op.id} (${op.op}) is still ${op.status === 'done' || op.status === 'error' ? 'running' : op.status}; poll again.`,
            { operation_id: op.id, status: 'running' },
          );
        return reply;
      }
      if (op.status === 'queued' || op.status === 'running') {
        const wait = operations.wait(op, windowMs);
        // A client that hangs up mid-poll costs nothing: its wait is dropped.
        reply.raw.once('close', wait.cancel);
        const outcome = await wait.outcome;
        if (outcome === 'shutdown') return shuttingDown(reply, op);
        if (outcome === 'timeout')
          return sendError(reply, 408, 'operation_pending', `Operation ${op.id} (${op.op}) is still ${op.status}; poll again.`, {
            operation_id: op.id,
            status: op.status,
          });
      }
      return op.status === 'done' ? { status: 'done' as const, result: op.result } : { status: 'error' as const, error: op.error };
    },
  );

  app.get(
    '/trainer/:run_id/policy_version',
    {
      schema: { tags, summary: 'Optimizer steps applied so far', params: RunParams, response: { 200: PolicyVersionResponse } },
    },
    (req) => {
      const { record } = target(req);
      return { policy_version: core.trainers.policyVersion(activeRun(record)) };
    },
  );

  app.get(
    '/trainer/:run_id/health',
    {
      schema: { tags, summary: '200 once the trainer is ready (after its cold start), 503 before', params: RunParams, response: { 200: HealthResponse } },
    },
    (req) => {
      const { record } = target(req);
      const run = activeRun(record);
      if (!core.trainers.isReady(run)) {
        const retry = Math.max(1, Math.ceil(core.fleet.coldStartLeft(run) / 1000));
        throw new LoopsError('unavailable', `The trainer of run ${run.id} is still starting; poll /health again.`, { retry_after_s: retry });
      }
      return { status: 'ok' };
    },
  );
}

/** 503 while shutting down (the SDK's ServerShutdownError), saying what became of the operation polled. */
function shuttingDown(reply: FastifyReply, op: Operation) {
  const notRun = op.status === 'error' && op.error?.error_class === 'ServerShutdown';
  return sendError(
    reply,
    503,
    'shutting_down',
    notRun
      ? `The trainer is shutting down; ${op.op} was still queued and was not run (nothing of it was done): submit it again to a running server.`
      : `The trainer is shutting down; ${op.op} is ${op.status === 'running' ? 'finishing, and will be recorded' : op.status}.`,
    { operation_id: op.id, operation_status: op.status, ...(op.error ? { error_class: op.error.error_class } : {}) },
  );
}

/** Without a key (allowed when keys are not enforced) a request acts as the run's owner. */
function ownerOf(core: LoopsCore, run: RunRecord) {
  return { org_id: run.org_id, user_id: run.user_id, team_id: run.team_id, email: core.accounts.emailOf(run.user_id) ?? '' };
}
