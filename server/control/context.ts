import type { FastifyBaseLogger, FastifyInstance, FastifyRequest, RawReplyDefaultExpression, RawRequestDefaultExpression, RawServerDefault } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { LoopsCore } from '../core/core.js';
import type { AnswerCache } from '../http/answer-cache.js';
import type { Views } from './views.js';

export type TypedApp = FastifyInstance<RawServerDefault, RawRequestDefaultExpression, RawReplyDefaultExpression, FastifyBaseLogger, TypeBoxTypeProvider>;

export interface ControlContext {
  core: LoopsCore;
  views: Views;
  /** The list routes' answers, kept while the records stand still. */
  answers: AnswerCache;
}

/** A list's answer for this caller and URL (path and query), built by `build` when none is kept. */
export function keptAnswer<T extends object>(ctx: ControlContext, request: FastifyRequest, build: () => T): T {
  return ctx.answers.get(answerKey(request), build);
}

/** What a list answer depends on besides the records: the caller, the route and its validated parameters, not the raw URL (`?&&&x` or a reordered query is the same answer). */
export function answerKey(request: Pick<FastifyRequest, 'principal' | 'routeOptions' | 'params' | 'query'>): string {
  const p = request.principal;
  return `${p.org_id} ${p.team_id} ${p.user_id} ${request.routeOptions.url} ${canonical(request.params)} ${canonical(request.query)}`;
}

/** A parameter object as text, its keys sorted (values are validated scalars). */
function canonical(values: unknown): string {
  if (typeof values !== 'object' || values === null) return '';
  return JSON.stringify(
    Object.entries(values as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
  );
}

/** Response schemas of a route: its 200 body. Errors share one shape, which /openapi.json adds to every route. */
export function replies<T>(ok: T) {
  return { 200: ok };
}

/** The team a request acts for: the path's `team_id` on team-scoped routes, else the caller's own team. */
export function teamOf(ctx: ControlContext, request: FastifyRequest): string {
  const teamId = (request.params as { team_id?: string }).team_id;
  return teamId === undefined ? request.principal.team_id : ctx.core.accounts.team(request.principal, teamId).id;
}
