//! A bounded map from statement text to what was worked out about it.
//!
//! Simple-protocol clients that inline their values send a stream of texts seen
//! once. Evicting whichever entry the hash map yields first let that stream evict
//! the same hot entry again and again when it sat early in the table. Eviction
//! here gives a second chance instead: when the map is full, the entries not read
//! since the last sweep go first, and the others lose their mark. A hot entry
//! survives any burst of one-off texts; a sweep frees room for many inserts, so
//! its cost is spread over them.

use std::collections::HashMap;

/// A map bounded in entries and in key bytes, with second-chance eviction.
#[derive(Debug)]
pub struct BoundedMap<V> {
    map: HashMap<Box<str>, Entry<V>>,
    max_entries: usize,
    max_key_bytes: usize,
    key_bytes: usize,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    /// Read since the last sweep.
    used: bool,
}

impl<V> BoundedMap<V> {
    /// An empty map that keeps at most `max_entries` entries whose keys take at
    /// most `max_key_bytes` bytes together.
    pub fn new(max_entries: usize, max_key_bytes: usize) -> Self {
        Self {
            map: HashMap::new(),
            max_entries,
            max_key_bytes,
            key_bytes: 0,
        }
    }

    /// The value for `key`, marking it as used.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.map.get_mut(key).map(|e| {
            e.used = true;
            &mut e.value
        })
    }

    /// The value for `key`, marking it as used.
    pub fn get(&mut self, key: &str) -> Option<&V> {
        self.get_mut(key).map(|v| &*v)
    }

    /// Stores `value` for `key` (replacing any), evicting to stay within the
    /// bounds. A key longer than the byte bound is not stored.
    pub fn insert(&mut self, key: &str, value: V) {
        if let Some(e) = self.map.get_mut(key) {
            e.value = value;
            e.used = true;
            return;
        }
        if key.len() > self.max_key_bytes || self.max_entries == 0 {
            return;
        }
        if !self.fits(key.len()) {
            self.sweep();
        }
        // Everything was in use since the last sweep: make room anyway.
        while !self.fits(key.len()) {
            let Some(victim) = self.map.keys().next().cloned() else {
                break;
            };
            self.key_bytes -= victim.len();
            self.map.remove(&victim);
        }
        self.key_bytes += key.len();
        self.map.insert(key.into(), Entry { value, used: false });
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.map.clear();
        self.key_bytes = 0;
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The keys, in no particular order (not marked as used).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|k| &**k)
    }

    /// The values, in no particular order (not marked as used).
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|e| &e.value)
    }

    /// The bytes the keys take.
    pub fn key_bytes(&self) -> usize {
        self.key_bytes
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn fits(&self, key_len: usize) -> bool {
        self.map.len() < self.max_entries && self.key_bytes + key_len <= self.max_key_bytes
    }

    /// Drops the entries not read since the last sweep and unmarks the others.
    fn sweep(&mut self) {
        let mut freed = 0;
        self.map.retain(|k, e| {
            let keep = std::mem::take(&mut e.used);
            if !keep {
                freed += k.len();
            }
            keep
        });
        self.key_bytes -= freed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_hold_in_entries_and_bytes() {
        let mut m = BoundedMap::new(4, 10);
        for i in 0..20 {
            m.insert(&format!("k{i}"), i);
            assert!(m.len() <= 4);
            assert!(m.key_bytes <= 10);
            assert_eq!(m.key_bytes, m.map.keys().map(|k| k.len()).sum::<usize>());
            if i % 3 == 0 {
                m.get(&format!("k{i}"));
            }
        }
        m.insert("this key is too long", 0);
        assert!(m.get("this key is too long").is_none());
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.key_bytes, 0);
    }

    #[test]
    fn a_hot_entry_survives_a_burst_of_one_off_keys() {
        let mut m = BoundedMap::new(64, 1 << 20);
        m.insert("hot", 0);
        for i in 0..10_000 {
            assert_eq!(m.get("hot"), Some(&0), "evicted after {i} one-off keys");
            m.insert(&format!("one-off {i}"), i);
        }
    }

    #[test]
    fn every_key_hot_still_makes_room() {
        let mut m = BoundedMap::new(3, 1 << 20);
        for k in ["a", "b", "c"] {
            m.insert(k, ());
            m.get(k);
        }
        m.insert("d", ());
        assert_eq!(m.len(), 3);
        assert!(m.get("d").is_some());
    }

    #[test]
    fn insert_replaces_an_existing_value() {
        let mut m = BoundedMap::new(2, 100);
        m.insert("a", 1);
        m.insert("a", 2);
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("a"), Some(&2));
        assert_eq!(m.key_bytes, 1);
    }
}
