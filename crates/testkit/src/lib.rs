//! Dev-only helpers that start real servers on loopback for tests.
