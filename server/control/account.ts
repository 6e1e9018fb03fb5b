import { BASE_MODELS } from '../../models/registry.js';
import type { ControlContext, TypedApp } from './context.js';
import { replies } from './context.js';
import { CapabilitiesResponse, PatchLoopsUserConfigRequestV1, TeamsQuery, TeamsResponse, UserConfigResponse } from './schemas.js';

/** Capabilities, the caller's accelerator config, and teams. */
export function accountRoutes(app: TypedApp, ctx: ControlContext): void {
  const { core, views } = ctx;

  app.get(
    '/v1/loops/capabilities',
    {
      schema: {
        tags: ['account'],
        summary: 'The base models this server accepts: maximum context length, whether they take images, whether serverless trains them',
        response: replies(CapabilitiesResponse),
      },
    },
    () => ({
      supported_models: BASE_MODELS.map((m) => ({
        model_name: m.name,
        max_context_length: m.maxContextLength,
        supports_vision_language: m.supportsVisionLanguage,
        serverless: m.serverless,
      })),
    }),
  );

  app.get(
    '/v1/loops/user_config',
    {
      schema: { tags: ['account'], summary: 'Your accelerator priorities (null = inherit the organisation allowlist)', response: replies(UserConfigResponse) },
    },
    (req) => ({ user_config: views.userConfig(core.userConfigs.get(req.principal)) }),
  );

  app.patch(
    '/v1/loops/user_config',
    {
      schema: {
        tags: ['account'],
        summary: 'Change accelerator priorities (JSON merge patch; empty lists rejected)',
        body: PatchLoopsUserConfigRequestV1,
        response: replies(UserConfigResponse),
      },
    },
    (req) => ({ user_config: views.userConfig(core.userConfigs.patch(req.principal, req.body)) }),
  );

  app.get(
    '/v1/teams',
    {
      schema: { tags: ['account'], summary: "Your organisation's teams", querystring: TeamsQuery, response: replies(TeamsResponse) },
    },
    (req) => ({ teams: core.accounts.listTeams(req.principal, req.query.name).map((t) => views.team(t)) }),
  );
}
