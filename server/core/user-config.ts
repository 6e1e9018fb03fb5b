import { invalid } from './errors.js';
import type { Principal, UserConfigRecord } from './records.js';
import type { Store } from './store.js';

export type PriorityField = 'trainer_accelerator_priority' | 'sampler_accelerator_priority';
const FIELDS: PriorityField[] = ['trainer_accelerator_priority', 'sampler_accelerator_priority'];

/** Per-user accelerator priorities. Null means "inherit the organisation's allowlist". */
export class UserConfigs {
  private readonly configs = new Map<string, UserConfigRecord>();

  constructor(private readonly store: Store) {
    for (const c of store.load<UserConfigRecord>('user_config')) this.configs.set(c.user_id, c);
  }

  get(p: Principal): UserConfigRecord {
    return this.configs.get(p.user_id) ?? { user_id: p.user_id, trainer_accelerator_priority: null, sampler_accelerator_priority: null };
  }

  /**
   * JSON Merge Patch per field: an absent field stays, null clears, a list
   * sets. An empty list is rejected, as upstream: null and [] would otherwise
   * be two spellings of one intent.
   */
  patch(p: Principal, patch: Partial<Record<PriorityField, string[] | null>>): UserConfigRecord {
    const next = { ...this.get(p) };
    for (const field of FIELDS) {
      if (!(field in patch)) continue;
      const value = patch[field];
      if (Array.isArray(value)) {
        if (value.length === 0)
          throw invalid(`${field} must not be an empty list: send null to inherit the organisation's allowlist, or list GPU types such as ["H100", "H200"].`, {
            field,
          });
        const seen = new Set<string>();
        for (const gpu of value) {
          if (!gpu.trim()) throw invalid(`${field} contains an empty GPU type.`, { field });
          if (seen.has(gpu)) throw invalid(`${field} lists '${gpu}' twice: each GPU type may appear once, in priority order.`, { field });
          seen.add(gpu);
        }
      }
      next[field] = value ?? null;
    }
    this.configs.set(p.user_id, next);
    this.store.put('user_config', p.user_id, next);
    return next;
  }
}
