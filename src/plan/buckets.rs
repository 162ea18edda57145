//! The one bucket splitter: data-parallel gradient reduction and the distributed optimizer's
//! parameter all-gather both run over a rank's parameters in buckets of at most N elements
//! (Megatron's `--ddp-bucket-size`), the last one smaller.

/// `elements` split into `full` buckets of `size` and one of `rest` (when not zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    /// Elements of a full bucket.
    pub size: u64,
    /// How many full buckets.
    pub full: u64,
    /// Elements of the smaller last bucket (0: none).
    pub rest: u64,
}

impl Buckets {
    /// `elements` in buckets of at most `bucket` (at least 1).
    pub fn new(elements: u64, bucket: u64) -> Buckets {
        let size = bucket.max(1);
        Buckets {
            size,
            full: elements / size,
            rest: elements % size,
        }
    }

    /// How many buckets.
    pub fn count(&self) -> u64 {
        self.full + u64::from(self.rest > 0)
    }

    /// (bucket size, how many of that size): at most two entries.
    pub fn sizes_with_counts(&self) -> impl Iterator<Item = (u64, u64)> {
        [
            (self.size, self.full),
            (self.rest, u64::from(self.rest > 0)),
        ]
        .into_iter()
        .filter(|&(_, n)| n > 0)
    }

    /// Size of bucket `k` (the full ones first).
    pub fn size_of(&self, k: u64) -> u64 {
        if k < self.full {
            self.size
        } else {
            self.rest
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_into_full_buckets_and_a_rest() {
        let b = Buckets::new(10, 4);
        assert_eq!(
            b.sizes_with_counts().collect::<Vec<_>>(),
            vec![(4, 2), (2, 1)]
        );
        assert_eq!((b.count(), b.size_of(1), b.size_of(2)), (3, 4, 2));
        let b = Buckets::new(8, 4);
        assert_eq!(b.sizes_with_counts().collect::<Vec<_>>(), vec![(4, 2)]);
        let b = Buckets::new(3, 4);
        assert_eq!(b.sizes_with_counts().collect::<Vec<_>>(), vec![(3, 1)]);
        assert_eq!(Buckets::new(0, 4).count(), 0);
    }
}
