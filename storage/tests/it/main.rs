//! Integration tests of the storage crate (one binary): properties of `apply` over random,
//! hostile command sequences.

mod apply_props;
