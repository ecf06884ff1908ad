//! A hint to the processor: start loading the cache line that holds a value, and go on
//! without waiting for it. A pair reaches a few records at random among thousands; a plain
//! load of each would stall it until the line arrives, a hint lets the lines come while it
//! works. `safe_arch` gives the instruction safely (a prefetch never faults); elsewhere it is
//! a no-op.

/// Starts loading the cache line that holds `value`.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse"
    ))]
    safe_arch::prefetch_t0(value);
    #[cfg(not(all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse"
    )))]
    let _ = value;
}
