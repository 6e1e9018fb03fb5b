import { createHash } from 'node:crypto';
import type { Clock } from './clock.js';
import { LoopsError, notFound } from './errors.js';
import type { OrgRecord, Principal, TeamRecord, UserRecord } from './records.js';
import type { Store } from './store.js';

/** One `--api-key KEY[:ORG[:TEAM]]`. */
export interface ApiKeySpec {
  key: string;
  org?: string;
  team?: string;
}

const DEFAULT_TEAM_NAME = 'Default Team';

/** A stable 7-character lowercase id derived from `parts`: the same key always maps to the same user. */
function stableId(...parts: string[]): string {
  const digest = createHash('sha256').update(parts.join('\u0000')).digest();
  return BigInt(`0x${digest.subarray(0, 8).toString('hex')}`)
    .toString(36)
    .padStart(7, '0')
    .slice(-7);
}

/**
 * API keys, users, organisations and teams. With configured keys only those
 * are accepted; otherwise any non-empty key is its own user in its own
 * organisation. Keys themselves are never stored, only a hash.
 */
export class Accounts {
  private readonly orgs = new Map<string, OrgRecord>();
  private readonly teams = new Map<string, TeamRecord>();
  private readonly users = new Map<string, UserRecord>();
  /** Configured keys (by hash); null when any key is accepted. */
  private readonly allowed: Map<string, ApiKeySpec> | null;

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    apiKeys: ApiKeySpec[],
  ) {
    for (const o of store.load<OrgRecord>('org')) this.orgs.set(o.id, o);
    for (const t of store.load<TeamRecord>('team')) this.teams.set(t.id, t);
    for (const u of store.load<UserRecord>('user')) this.users.set(u.id, u);
    this.allowed = apiKeys.length ? new Map(apiKeys.map((s) => [keyHash(s.key), s])) : null;
    for (const spec of apiKeys) this.ensureUser(spec);
  }

  /** Principals of keys seen, so the hot path hashes each key once. */
  private readonly principals = new Map<string, Principal>();

  /** The principal behind an API key, or 401. */
  authenticate(key: string): Principal {
    const known = this.principals.get(key);
    if (known) return known;
    if (!key) throw new LoopsError('unauthorized', 'The API key is empty: send `Authorization: Bearer <key>`.');
    const hash = keyHash(key);
    let spec: ApiKeySpec | undefined;
    if (this.allowed) {
      spec = this.allowed.get(hash);
      if (!spec) throw new LoopsError('unauthorized', 'Unknown API key: this server only accepts the keys it was started with (--api-key).');
    } else {
      spec = { key };
    }
    const user = this.users.get(stableId('user', hash)) ?? this.ensureUser(spec);
    const principal = { user_id: user.id, org_id: user.org_id, team_id: user.team_id, email: user.email };
    // Bounded: a client cycling through random keys must not grow memory without end.
    if (this.principals.size >= 10_000) this.principals.clear();
    this.principals.set(key, principal);
    return principal;
  }

  /** Whether only configured keys are accepted (then the data planes require a key too). */
  get enforced(): boolean {
    return this.allowed !== null;
  }

  emailOf(userId: string): string | null {
    return this.users.get(userId)?.email ?? null;
  }

  /** Teams of the caller's organisation, optionally filtered by exact name. */
  listTeams(p: Principal, name?: string): TeamRecord[] {
    return [...this.teams.values()].filter((t) => t.org_id === p.org_id && (name === undefined || t.name === name));
  }

  /**
   * That the caller may create in and change what belongs to `teamId`: its
   * own team, or its organisation's Default Team, which every member is in.
   * Other teams of the organisation stay visible (scope=org lists them) but
   * are not the caller's to change: 403 naming the team.
   */
  requireMember(p: Principal, teamId: string, what: string): void {
    const team = this.teams.get(teamId);
    if (team && team.org_id === p.org_id && (team.id === p.team_id || team.is_default)) return;
    const own = this.teams.get(p.team_id)?.name ?? p.team_id;
    throw new LoopsError(
      'forbidden',
      `Cannot ${what}: it belongs to team '${team?.name ?? teamId}', and your key acts in team '${own}' and your organisation's Default Team. Other teams' resources can be read (scope=org), not changed: use a key of that team.`,
      { field: 'team_id', team_id: teamId },
    );
  }

  /** A team of the caller's organisation, or 404. */
  team(p: Principal, teamId: string): TeamRecord {
    const team = this.teams.get(teamId);
    if (!team || team.org_id !== p.org_id) throw notFound(`Team '${teamId}' not found in your organisation. GET /v1/teams lists yours.`, { field: 'team_id' });
    return team;
  }

  private ensureUser(spec: ApiKeySpec): UserRecord {
    const hash = keyHash(spec.key);
    const userId = stableId('user', hash);
    const existing = this.users.get(userId);
    if (existing) return existing;
    // An unnamed organisation is private to the key.
    const orgName = spec.org ?? `org-${userId}`;
    const orgId = stableId('org', orgName);
    const defaultTeam = this.ensureTeam(orgId, orgName, DEFAULT_TEAM_NAME, true);
    const team = spec.team && spec.team !== DEFAULT_TEAM_NAME ? this.ensureTeam(orgId, orgName, spec.team, false) : defaultTeam;
    const user: UserRecord = { id: userId, org_id: orgId, team_id: team.id, email: `user-${userId}@${slug(orgName)}.loops-mock.local` };
    this.users.set(user.id, user);
    this.store.put('user', user.id, user);
    return user;
  }

  private ensureTeam(orgId: string, orgName: string, name: string, isDefault: boolean): TeamRecord {
    if (!this.orgs.has(orgId)) {
      const org: OrgRecord = { id: orgId, name: orgName };
      this.orgs.set(orgId, org);
      this.store.put('org', orgId, org);
    }
    const id = stableId('team', orgId, name);
    let team = this.teams.get(id);
    if (!team) {
      team = { id, org_id: orgId, name, is_default: isDefault, created_at: this.clock.now() };
      this.teams.set(id, team);
      this.store.put('team', id, team);
    }
    return team;
  }
}

function keyHash(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

function slug(s: string): string {
  return (
    s
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-|-$/g, '') || 'org'
  );
}
