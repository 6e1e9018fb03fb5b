/**
 * A Map that keeps at most `capacity` entries, evicting the least recently
 * used: `set` and `get` make an entry the newest, `peek` reads it without
 * (for caches whose order follows writes alone).
 */
export class LruMap<K, V> {
  private readonly entries = new Map<K, V>();

  constructor(
    readonly capacity: number,
    private readonly onEvict?: (key: K, value: V) => void,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get(key: K): V | undefined {
    const value = this.entries.get(key);
    if (value !== undefined) {
      this.entries.delete(key);
      this.entries.set(key, value);
    }
    return value;
  }

  peek(key: K): V | undefined {
    return this.entries.get(key);
  }

  set(key: K, value: V): this {
    this.entries.delete(key);
    this.entries.set(key, value);
    while (this.entries.size > this.capacity) {
      const [oldest, evicted] = this.entries.entries().next().value!;
      this.entries.delete(oldest);
      this.onEvict?.(oldest, evicted);
    }
    return this;
  }

  clear(): void {
    this.entries.clear();
  }

  delete(key: K): boolean {
    return this.entries.delete(key);
  }
}
