//! A clock for leases and clock anchors that keeps counting while the machine is suspended:
//! `CLOCK_BOOTTIME`. The monotonic clock (`tokio::time::Instant`) stops during a suspend, so a
//! lease measured with it would outlive a VM pause as long as the pause; boot time moves on,
//! and a lease taken before the pause has run out when the node resumes.

use std::time::Duration;

use rustix::time::{clock_gettime, ClockId};

/// An instant of the boot-time clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    pub fn now() -> BootInstant {
        let t = clock_gettime(ClockId::Boottime);
        BootInstant(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
    }

    /// The time since the machine booted.
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This instant moved `by` later.
    pub fn plus(self, by: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(by))
    }

    /// The time from now until this instant; zero if it has passed.
    pub fn remaining(self) -> Duration {
        self.saturating_duration_since(BootInstant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_moves_forward() {
        let a = BootInstant::now();
        let b = BootInstant::now();
        assert!(b >= a);
        assert_eq!(a.saturating_duration_since(b.plus(Duration::from_secs(1))), Duration::ZERO);
        assert_eq!(a.plus(Duration::from_millis(5)).saturating_duration_since(a), Duration::from_millis(5));
    }
}
