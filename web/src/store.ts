// State kept in one place: a value that views subscribe to and derive from.
import { useEffect, useState } from "preact/hooks";

export class Store<T> {
  private listeners = new Set<(value: T) => void>();
  constructor(private current: T) {}

  get value(): T {
    return this.current;
  }
  set(value: T) {
    this.current = value;
    for (const listener of this.listeners) listener(value);
  }
  update(change: (value: T) => T) {
    this.set(change(this.current));
  }
  subscribe(listener: (value: T) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}

// The store's value, re-rendering the component when it changes.
export function useStore<T>(store: Store<T>): T {
  const [value, setValue] = useState(store.value);
  useEffect(() => {
    setValue(store.value);
    return store.subscribe(setValue);
  }, [store]);
  return value;
}
